"""Plugins for the engines people run: ``kernelpick.engines.vllm`` (a vLLM quantization
config, registered through vLLM's ``vllm.general_plugins`` entry point) and
``kernelpick.engines.transformers`` (a transformers quantizer, registered on import).

Neither engine is imported until its module is: ``import kernelpick`` imports neither.
"""

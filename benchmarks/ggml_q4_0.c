/* llama.cpp's Q4_0 matrix-vector product, timed beside kernelpick's int4 layers
 * (benchmarks/ggml_peer.py builds this against a ggml install and calls it with ctypes).
 *
 * A weight is quantized once to Q4_0 (blocks of 32 values: one fp16 scale, 16 bytes of
 * nibbles) into a buffer of the CPU backend's CPU_REPACK type where that takes it (N % 8 on
 * x86 with AVX2), which interleaves eight rows for its GEMM kernels, as llama.cpp loads a
 * model by default; else into a plain context. Each product runs ggml_mul_mat on the CPU
 * backend through one thread pool that every weight shares, as llama.cpp's decode does: ggml
 * quantizes the fp32 activations to Q8_0 and multiplies on int8 dot products. The pool does
 * not poll between calls, so its threads take no time from the callables timed in between.
 */

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KP_SLOTS 8 /* graphs a weight keeps, one per count of tokens */

struct kp_graph {
  int64_t m;
  struct ggml_context* ctx;
  struct ggml_tensor* x;
  struct ggml_tensor* y;
  struct ggml_cgraph* graph;
};

struct kp_weight {
  int64_t n, k;
  int repacked;
  struct ggml_context* ctx;
  ggml_backend_buffer_t buffer; /* the CPU_REPACK buffer, or NULL */
  struct ggml_tensor* w;
  struct kp_graph graphs[KP_SLOTS];
};

void kp_ggml_free(struct kp_weight* h);

static struct ggml_threadpool* pool = NULL;
static int pool_threads = 0;
static uint8_t* work = NULL;
static size_t work_size = 0;

static void quiet(enum ggml_log_level level, const char* text, void* user) {
  (void)level, (void)text, (void)user; /* each repacked weight would log a line */
}

/* The shared pool of n_threads threads; 0 on success. */
int kp_ggml_threads(int n_threads) {
  if (pool != NULL && pool_threads == n_threads) return 0;
  if (pool != NULL) ggml_threadpool_free(pool);
  ggml_log_set(quiet, NULL);
  ggml_cpu_init();
  struct ggml_threadpool_params params = ggml_threadpool_params_default(n_threads);
  params.poll = 0;
  pool = ggml_threadpool_new(&params);
  pool_threads = pool == NULL ? 0 : n_threads;
  return pool == NULL;
}

/* The CPU backend's CPU_REPACK buffer type, or NULL where this build has none. */
static ggml_backend_buffer_type_t repack_type(void) {
  ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  if (dev == NULL) return NULL;
  ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
  ggml_backend_dev_get_extra_bufts_t extra =
      (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
          reg, "ggml_backend_dev_get_extra_bufts");
  if (extra == NULL) return NULL;
  for (ggml_backend_buffer_type_t* t = extra(dev); t != NULL && *t != NULL; ++t) {
    if (strcmp(ggml_backend_buft_name(*t), "CPU_REPACK") == 0) return *t;
  }
  return NULL;
}

/* A Q4_0 copy of the fp32 weight [n, k] (k a multiple of 32), repacked where the backend
 * takes it and ``repack`` asks, or NULL. */
struct kp_weight* kp_ggml_weight(const float* weight, int64_t n, int64_t k, int repack) {
  if (k % 32 != 0) return NULL;
  struct kp_weight* h = calloc(1, sizeof(struct kp_weight));
  if (h == NULL) return NULL;
  /* CPU_REPACK's Q4_0 tiles need N % 8 and, on x86, AVX2 (ggml-cpu/repack.cpp); where
   * its rule fails it would hold the tensor with no layout, so the plain rows are kept. */
  int tiles = n % 8 == 0 && ggml_cpu_has_avx2();
  ggml_backend_buffer_type_t buft = repack && tiles ? repack_type() : NULL;
  size_t bytes = ggml_row_size(GGML_TYPE_Q4_0, k) * n;
  struct ggml_init_params params = {ggml_tensor_overhead() + (buft ? 0 : bytes) + 64, NULL,
                                    buft != NULL};
  h->ctx = ggml_init(params);
  if (h->ctx == NULL) {
    free(h);
    return NULL;
  }
  h->n = n;
  h->k = k;
  h->w = ggml_new_tensor_2d(h->ctx, GGML_TYPE_Q4_0, k, n);
  if (buft == NULL) {
    ggml_quantize_chunk(GGML_TYPE_Q4_0, weight, h->w->data, 0, n, k, NULL);
    return h;
  }
  void* packed = malloc(bytes);
  h->buffer = packed == NULL ? NULL : ggml_backend_alloc_ctx_tensors_from_buft(h->ctx, buft);
  if (h->buffer == NULL) {
    free(packed);
    kp_ggml_free(h);
    return NULL;
  }
  ggml_quantize_chunk(GGML_TYPE_Q4_0, weight, packed, 0, n, k, NULL);
  ggml_backend_tensor_set(h->w, packed, 0, bytes); /* repacks into eight-row tiles */
  free(packed);
  h->repacked = 1;
  return h;
}

int kp_ggml_repacked(const struct kp_weight* h) { return h->repacked; }

size_t kp_ggml_bytes(const struct kp_weight* h) { return ggml_nbytes(h->w); }

static struct kp_graph* graph_for(struct kp_weight* h, int64_t m) {
  for (int i = 0; i < KP_SLOTS; ++i) {
    if (h->graphs[i].ctx != NULL && h->graphs[i].m == m) return &h->graphs[i];
  }
  struct kp_graph* g = &h->graphs[0];
  for (int i = 0; i < KP_SLOTS; ++i) {
    if (h->graphs[i].ctx == NULL) {
      g = &h->graphs[i];
      break;
    }
  }
  if (g->ctx != NULL) ggml_free(g->ctx);
  size_t bytes = 3 * ggml_tensor_overhead() + ggml_graph_overhead() +
                 (size_t)(m * (h->k + h->n)) * sizeof(float) + 256;
  struct ggml_init_params params = {bytes, NULL, false};
  g->ctx = ggml_init(params);
  if (g->ctx == NULL) return NULL;
  g->m = m;
  g->x = ggml_new_tensor_2d(g->ctx, GGML_TYPE_F32, h->k, m);
  g->y = ggml_mul_mat(g->ctx, h->w, g->x);
  g->graph = ggml_new_graph(g->ctx);
  ggml_build_forward_expand(g->graph, g->y);
  return g;
}

/* out [m, n] = x [m, k] @ W^T, in fp32 on the shared pool; 0 on success. */
int kp_ggml_matmul(struct kp_weight* h, const float* x, int64_t m, float* out) {
  if (pool == NULL) return 1;
  struct kp_graph* g = graph_for(h, m);
  if (g == NULL) return 2;
  memcpy(g->x->data, x, (size_t)(m * h->k) * sizeof(float));
  struct ggml_cplan plan = ggml_graph_plan(g->graph, pool_threads, pool);
  if (plan.work_size > work_size) {
    free(work);
    work = malloc(plan.work_size);
    work_size = work == NULL ? 0 : plan.work_size;
    if (work == NULL) return 3;
  }
  plan.work_data = work;
  if (ggml_graph_compute(g->graph, &plan) != GGML_STATUS_SUCCESS) return 4;
  memcpy(out, g->y->data, (size_t)(m * h->n) * sizeof(float));
  return 0;
}

void kp_ggml_free(struct kp_weight* h) {
  if (h == NULL) return;
  for (int i = 0; i < KP_SLOTS; ++i) {
    if (h->graphs[i].ctx != NULL) ggml_free(h->graphs[i].ctx);
  }
  ggml_free(h->ctx);
  if (h->buffer != NULL) ggml_backend_buffer_free(h->buffer);
  free(h);
}

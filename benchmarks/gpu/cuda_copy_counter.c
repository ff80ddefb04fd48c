/* Counts the bytes the CUDA runtime copies between host and device, for benchmarks/gpu/decode_loop.py.
 *
 * Preloaded (LD_PRELOAD) into a process whose CUDA library calls go through libcudart's dynamic
 * symbols, as onnxruntime-gpu's provider library's do: each cudaMemcpy* call below is counted by
 * direction, then forwarded to the real function (dlsym RTLD_NEXT). The benchmark reads the
 * counters through ctypes (s2s_copy_counts) and sets them beside its transfer ledger's figures.
 * cudaMemcpyDefault (unified addressing) is resolved with cudaPointerGetAttributes.
 *
 *   cc -O2 -shared -fPIC -o cuda_copy_counter.so cuda_copy_counter.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
enum { H2H = 0, H2D = 1, D2H = 2, D2D = 3, DEFAULT = 4 };

/* cudaPointerAttributes as CUDA 11+ lays it out: the memory type comes first */
struct pointer_attributes { int type; int device; void *device_pointer; void *host_pointer; };
enum { MEMORY_UNREGISTERED = 0, MEMORY_HOST = 1, MEMORY_DEVICE = 2, MEMORY_MANAGED = 3 };

static volatile uint64_t bytes_by_kind[5], calls_by_kind[5];

/* The runtime's own function. RTLD_NEXT finds it where libcudart is in the global scope; a library
   loaded with RTLD_LOCAL (dlopen's default, ctypes' too) brings its libcudart into its own scope
   only, so look the loaded libcudart up by its soname then. */
static void *real(const char *name) {
  static const char *const sonames[] = {"libcudart.so.13", "libcudart.so.12", NULL};
  void *f = dlsym(RTLD_NEXT, name);
  for (int i = 0; !f && sonames[i]; i++) {
    void *handle = dlopen(sonames[i], RTLD_LAZY | RTLD_NOLOAD);
    if (handle) f = dlsym(handle, name);
  }
  return f;
}

#define UNKNOWN_ERROR 999 /* cudaErrorUnknown: no runtime function to forward to */

static int on_device(const void *pointer) {
  static cudaError_t (*get)(struct pointer_attributes *, const void *) = NULL;
  struct pointer_attributes a = {0};
  if (!get) get = (cudaError_t (*)(struct pointer_attributes *, const void *))real("cudaPointerGetAttributes");
  if (!get || get(&a, pointer) != 0) return 0;
  return a.type == MEMORY_DEVICE || a.type == MEMORY_MANAGED;
}

static void count(int kind, const void *dst, const void *src, size_t bytes) {
  if (kind == DEFAULT) {
    int from_device = on_device(src), to_device = on_device(dst);
    kind = from_device ? (to_device ? D2D : D2H) : (to_device ? H2D : H2H);
  }
  if (kind < 0 || kind > 4) return;
  __atomic_add_fetch(&bytes_by_kind[kind], bytes, __ATOMIC_RELAXED);
  __atomic_add_fetch(&calls_by_kind[kind], 1, __ATOMIC_RELAXED);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
  static cudaError_t (*f)(void *, const void *, size_t, int) = NULL;
  if (!f) f = (cudaError_t (*)(void *, const void *, size_t, int))real("cudaMemcpy");
  if (!f) return UNKNOWN_ERROR;
  count(kind, dst, src, n);
  return f(dst, src, n, kind);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t s) {
  static cudaError_t (*f)(void *, const void *, size_t, int, cudaStream_t) = NULL;
  if (!f) f = (cudaError_t (*)(void *, const void *, size_t, int, cudaStream_t))real("cudaMemcpyAsync");
  if (!f) return UNKNOWN_ERROR;
  count(kind, dst, src, n);
  return f(dst, src, n, kind, s);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, int kind, cudaStream_t s) {
  static cudaError_t (*f)(void *, size_t, const void *, size_t, size_t, size_t, int, cudaStream_t) = NULL;
  if (!f) f = (cudaError_t (*)(void *, size_t, const void *, size_t, size_t, size_t, int, cudaStream_t))real("cudaMemcpy2DAsync");
  if (!f) return UNKNOWN_ERROR;
  count(kind, dst, src, width * height);
  return f(dst, dpitch, src, spitch, width, height, kind, s);
}

/* bytes[5], calls[5] by cudaMemcpyKind: host-to-host, host-to-device, device-to-host,
   device-to-device, and (always 0 here: resolved above) default */
void s2s_copy_counts(uint64_t *bytes, uint64_t *calls) {
  for (int k = 0; k < 5; k++) {
    bytes[k] = __atomic_load_n(&bytes_by_kind[k], __ATOMIC_RELAXED);
    calls[k] = __atomic_load_n(&calls_by_kind[k], __ATOMIC_RELAXED);
  }
}

/*
 * A stand-in libcuda.so.1 for machines with no NVIDIA driver.
 *
 * The PyPI sgl_kernel wheels link their extension modules against the CUDA driver API, so they fail to import
 * without a libcuda.so.1 exposing these symbols, although SGLang's CPU path never calls them. Every function here
 * reports CUDA_ERROR_NO_DEVICE (100); nothing is ever executed on a device. Built with gcc by
 * sglang_prorsa/srt/cpu_recipe.py into a cache and put on LD_LIBRARY_PATH only when torch sees no CUDA device.
 */
#include <stddef.h>

typedef int CUresult;
#define CUDA_ERROR_NO_DEVICE 100

static const char kNoDevice[] = "CUDA_ERROR_NO_DEVICE (sglang-prorsa libcuda stub: no NVIDIA driver here)";

CUresult cuGetErrorString(CUresult error, const char **str) {
  (void)error;
  if (str) *str = kNoDevice;
  return 0;
}
CUresult cuGetErrorName(CUresult error, const char **str) { return cuGetErrorString(error, str); }
CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDriverGetVersion(int *version) { if (version) *version = 0; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDeviceGetCount(int *count) { if (count) *count = 0; return CUDA_ERROR_NO_DEVICE; }

#define NO_DEVICE(name) \
  CUresult name(void) { return CUDA_ERROR_NO_DEVICE; }

NO_DEVICE(cuPointerGetAttribute)
NO_DEVICE(cuCtxFromGreenCtx)
NO_DEVICE(cuCtxPopCurrent_v2)
NO_DEVICE(cuCtxPushCurrent_v2)
NO_DEVICE(cuDevResourceGenerateDesc)
NO_DEVICE(cuDevSmResourceSplitByCount)
NO_DEVICE(cuDeviceGetDevResource)
NO_DEVICE(cuGetProcAddress_v2)
NO_DEVICE(cuGreenCtxCreate)
NO_DEVICE(cuGreenCtxDestroy)
NO_DEVICE(cuGreenCtxGetDevResource)
NO_DEVICE(cuStreamCreate)

// Page-first KV export/import for pools in GPU memory (layout: kernels/layout.py; checksum: kernels/checksum.py).
//
// One launch per call. Work item = one (record, buffer) chunk, handled by one warp: its lanes stride through the
// chunk in 16-byte vectors (4-byte words where alignment forbids), several loads in flight per lane before the
// stores. Items are numbered record-major, so neighbouring warps write neighbouring bytes of the transfer buffer on
// export and read neighbouring bytes on import. A grid-stride loop keeps the grid bounded for any request size.
//
// Per-layer base addresses arrive as a device array (int64) built once per pool, so the kernel never needs one
// argument per layer. Checksums: each warp reduces its chunk's share and adds it to the record's sum with one
// 64-bit atomic (integer addition, so the result does not depend on order).
//
// Light headers only (no torch/extension.h): the ops register with the dispatcher as torch.ops.prorsa_kv_cuda.*.

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

namespace {

using u64 = unsigned long long;  // the type atomicAdd and __shfl_xor_sync take for 64-bit integers

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;  // vectors in flight per lane

// Share of the checksum of 4 consecutive words whose first word has index `w` in its record.
__device__ __forceinline__ u64 weigh4(const uint4& v, u64 w) {
  return static_cast<u64>(v.x) * (2 * w + 1) + static_cast<u64>(v.y) * (2 * w + 3) +
         static_cast<u64>(v.z) * (2 * w + 5) + static_cast<u64>(v.w) * (2 * w + 7);
}

// Copies `n16` 16-byte vectors with the warp; returns this lane's checksum share (0 unless kChecksum).
template <bool kChecksum>
__device__ __forceinline__ u64 copy_vectors(uint4* __restrict__ dst, const uint4* __restrict__ src, int64_t n16,
                                            u64 first_word, int lane) {
  u64 acc = 0;
  for (int64_t base = lane; base < n16; base += kWarpSize * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kWarpSize;
      if (i < n16) v[u] = __ldcs(src + i);  // streamed: each byte is read exactly once
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kWarpSize;
      if (i < n16) {
        __stcs(dst + i, v[u]);
        if constexpr (kChecksum) acc += weigh4(v[u], first_word + 4 * static_cast<u64>(i));
      }
    }
  }
  return acc;
}

// Fallback for chunks that are only 4-byte aligned.
template <bool kChecksum>
__device__ __forceinline__ u64 copy_words(uint32_t* __restrict__ dst, const uint32_t* __restrict__ src, int64_t n4,
                                          u64 first_word, int lane) {
  u64 acc = 0;
  for (int64_t i = lane; i < n4; i += kWarpSize) {
    const uint32_t w = src[i];
    dst[i] = w;
    if constexpr (kChecksum) acc += static_cast<u64>(w) * (2 * (first_word + static_cast<u64>(i)) + 1);
  }
  return acc;
}

template <bool kExport, bool kChecksum>
__global__ void move_chunks(const int64_t* __restrict__ ptrs, const int64_t* __restrict__ chunks, int64_t num_buffers,
                            const int64_t* __restrict__ pages, int64_t num_pages, int64_t page_bytes,
                            uint8_t* __restrict__ records, u64* __restrict__ sums) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  const int64_t items = num_pages * num_buffers;
  for (int64_t item = warp; item < items; item += warps) {
    const int64_t j = item / num_buffers;
    const int64_t b = item - j * num_buffers;
    const int64_t chunk = chunks[b];
    const int64_t offset = chunks[num_buffers + b];
    uint8_t* pool = reinterpret_cast<uint8_t*>(ptrs[b]) + pages[j] * chunk;
    uint8_t* record = records + j * page_bytes + offset;
    uint8_t* dst = kExport ? record : pool;
    const uint8_t* src = kExport ? pool : record;
    const u64 first_word = static_cast<u64>(offset / 4);
    u64 acc;
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | static_cast<uintptr_t>(chunk)) & 15) == 0) {
      acc = copy_vectors<kChecksum>(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), chunk / 16,
                                    first_word, lane);
    } else {
      acc = copy_words<kChecksum>(reinterpret_cast<uint32_t*>(dst), reinterpret_cast<const uint32_t*>(src), chunk / 4,
                                  first_word, lane);
    }
    if constexpr (kChecksum) {
#pragma unroll
      for (int delta = kWarpSize / 2; delta > 0; delta /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, delta);
      if (lane == 0) atomicAdd(sums + j, acc);
    }
  }
}

void check_table(const at::Tensor& t, const at::Device& device, const char* name) {
  TORCH_CHECK(t.device() == device && t.scalar_type() == at::kLong && t.is_contiguous(), name,
              " must be a contiguous int64 tensor on ", device);
}

template <bool kExport>
void launch(const at::Tensor& ptrs, const at::Tensor& chunks, const at::Tensor& pages, int64_t pool_pages,
            const at::Tensor& records, const at::Tensor& sums) {
  const at::Device device = records.device();
  TORCH_CHECK(device.is_cuda(), "transfer buffer must be on a CUDA device");
  check_table(ptrs, device, "ptrs");
  check_table(chunks, device, "chunks");
  check_table(pages, device, "pages");
  const int64_t num_buffers = ptrs.numel();
  TORCH_CHECK(chunks.dim() == 2 && chunks.size(0) == 2 && chunks.size(1) == num_buffers,
              "chunks must be a [2, num_buffers] table");
  TORCH_CHECK(records.scalar_type() == at::kByte && records.is_contiguous(), "transfer buffer must be contiguous uint8");
  const int64_t num_pages = pages.numel();
  TORCH_CHECK(num_pages == 0 || records.numel() % num_pages == 0, "transfer buffer is not whole records");
  const int64_t page_bytes = num_pages ? records.numel() / num_pages : 0;
  const bool with_sums = sums.numel() > 0;
  if (with_sums) {
    check_table(sums, device, "sums");
    TORCH_CHECK(sums.numel() == num_pages, "need one checksum slot per page");
  }
  (void)pool_pages;  // bounds are checked by the Python caller (a device-side check would need a sync to report)
  if (num_pages == 0) return;

  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
  if (with_sums) {
    C10_CUDA_CHECK(cudaMemsetAsync(sums.data_ptr(), 0, num_pages * sizeof(int64_t), stream));
  }
  int sm_count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device.index()));
  const int64_t items = num_pages * num_buffers;
  // Enough resident warps to cover memory latency on every SM; the grid-stride loop does the rest.
  const int64_t wanted = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(wanted, static_cast<int64_t>(sm_count) * 16));
  const dim3 block(kWarpsPerBlock * kWarpSize);
  auto* out_sums = with_sums ? reinterpret_cast<u64*>(sums.data_ptr<int64_t>()) : nullptr;
  auto* rec = records.data_ptr<uint8_t>();
  if (with_sums) {
    move_chunks<kExport, true><<<blocks, block, 0, stream>>>(ptrs.data_ptr<int64_t>(), chunks.data_ptr<int64_t>(),
                                                             num_buffers, pages.data_ptr<int64_t>(), num_pages,
                                                             page_bytes, rec, out_sums);
  } else {
    move_chunks<kExport, false><<<blocks, block, 0, stream>>>(ptrs.data_ptr<int64_t>(), chunks.data_ptr<int64_t>(),
                                                              num_buffers, pages.data_ptr<int64_t>(), num_pages,
                                                              page_bytes, rec, nullptr);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void export_pages(const at::Tensor& ptrs, const at::Tensor& chunks, const at::Tensor& pages, int64_t pool_pages,
                  const at::Tensor& out, const at::Tensor& sums) {
  launch<true>(ptrs, chunks, pages, pool_pages, out, sums);
}

void import_pages(const at::Tensor& ptrs, const at::Tensor& chunks, const at::Tensor& pages, int64_t pool_pages,
                  const at::Tensor& data, const at::Tensor& sums) {
  launch<false>(ptrs, chunks, pages, pool_pages, data, sums);
}

}  // namespace

TORCH_LIBRARY(prorsa_kv_cuda, m) {
  m.def("export_pages(Tensor ptrs, Tensor chunks, Tensor pages, int pool_pages, Tensor(a!) out, Tensor(b!) sums) -> ()",
        &export_pages);
  m.def("import_pages(Tensor ptrs, Tensor chunks, Tensor pages, int pool_pages, Tensor data, Tensor(b!) sums) -> ()",
        &import_pages);
}

// Page-first KV export/import for pools in host memory (see kernels/layout.py for the layout).
//
// One parallel loop (ATen's OpenMP backend) over records: each iteration moves every buffer's chunk of one page with
// memcpy and, if asked, folds the chunk into the record's checksum while it is still in cache. A whole record per
// iteration means each thread writes (export) or reads (import) one contiguous stretch of the transfer buffer.
//
// Only light ATen headers are included (no torch/extension.h, no pybind11) so the one-time JIT build stays short;
// the ops are registered with the dispatcher and called as torch.ops.prorsa_kv_cpu.*.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

using u32 = uint32_t;
using u64 = uint64_t;

// Checksum contribution of `n_words` words whose first word has index `first` in its record (kernels/checksum.py).
// w*(2*(first+j)+1) is split into w*(2j+1) + 2*first*w so the per-word multiply is 32x32->64 bits.
u64 chunk_checksum(const uint8_t* bytes, int64_t n_words, u64 first) {
  u64 plain = 0;
  u64 weighted = 0;
  u32 weight = 1;
  for (int64_t j = 0; j < n_words; ++j, weight += 2) {
    u32 w;
    std::memcpy(&w, bytes + 4 * j, sizeof(w));  // aliasing-safe load; compiles to a plain load
    plain += w;
    weighted += static_cast<u64>(w) * weight;
  }
  return weighted + 2 * first * plain;
}

// Portable chunk copy: memcpy, then the checksum re-read from the (now cached) destination.
template <bool kChecksum>
u64 copy_chunk_portable(uint8_t* dst, const uint8_t* src, int64_t n, u64 first) {
  std::memcpy(dst, src, static_cast<size_t>(n));
  return kChecksum ? chunk_checksum(dst, n / 4, first) : 0;
}

// The vector loops below avoid multiplies. With V words per vector, word i = V*t + k of a chunk (t = vector number,
// k = lane) has weight 2i+1 = 2V*t + 2k+1. Each 64-bit accumulator lane keeps a_k = sum_t w and c_k = sum_t a_k(t),
// the running sum of running sums; since c_k = sum_t w*(T - t) over T vectors, sum_t w*t = T*a_k - c_k, so
//   chunk checksum = sum_k [ 2V*(T*a_k - c_k) + (2k+1)*a_k ] + 2*first*sum_k a_k   (all mod 2**64).
// That is four adds per vector on top of the load and store, instead of two 32x32->64 multiplies.
u64 finish_lanes(const u64* a, const u64* c, int words_per_vector, int64_t vectors, u64 first) {
  u64 sum = 0;
  u64 plain = 0;
  for (int k = 0; k < words_per_vector; ++k) {
    const u64 t_weighted = static_cast<u64>(vectors) * a[k] - c[k];
    sum += 2 * static_cast<u64>(words_per_vector) * t_weighted + (2 * static_cast<u64>(k) + 1) * a[k];
    plain += a[k];
  }
  return sum + 2 * first * plain;
}

#if defined(__x86_64__)
// Streaming (kStream) stores bypass the cache: a large transfer buffer or pool is not read back soon, and skipping
// the read-for-ownership of every destination line is what brings a gather close to a plain memcpy (which glibc
// also does with streaming stores at these sizes). The checksum is taken from the words while they are in registers.

template <bool kChecksum, bool kStream>
__attribute__((target("avx2"))) u64 copy_chunk_avx2(uint8_t* dst, const uint8_t* src, int64_t n, u64 first) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | static_cast<uintptr_t>(n)) & 31) != 0) {
    return copy_chunk_portable<kChecksum>(dst, src, n, first);
  }
  const __m256i low = _mm256_set1_epi64x(0xFFFFFFFF);
  __m256i a_even = _mm256_setzero_si256(), a_odd = a_even, c_even = a_even, c_odd = a_even;
  const int64_t vectors = n / 32;
#pragma GCC unroll 4
  for (int64_t t = 0; t < vectors; ++t) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(src + 32 * t));
    if constexpr (kStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32 * t), v);
    } else {
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 32 * t), v);
    }
    if constexpr (kChecksum) {
      a_even = _mm256_add_epi64(a_even, _mm256_and_si256(v, low));  // words 0, 2, 4, 6
      a_odd = _mm256_add_epi64(a_odd, _mm256_srli_epi64(v, 32));     // words 1, 3, 5, 7
      c_even = _mm256_add_epi64(c_even, a_even);
      c_odd = _mm256_add_epi64(c_odd, a_odd);
    }
  }
  if constexpr (!kChecksum) {
    return 0;
  }
  alignas(32) u64 lanes[4][4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[0]), a_even);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[1]), a_odd);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[2]), c_even);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[3]), c_odd);
  u64 a[8], c[8];
  for (int m = 0; m < 4; ++m) {  // 64-bit lane m of the even/odd vectors holds word 2m / 2m+1
    a[2 * m] = lanes[0][m];
    a[2 * m + 1] = lanes[1][m];
    c[2 * m] = lanes[2][m];
    c[2 * m + 1] = lanes[3][m];
  }
  return finish_lanes(a, c, 8, vectors, first);
}

template <bool kChecksum, bool kStream>
u64 copy_chunk_sse2(uint8_t* dst, const uint8_t* src, int64_t n, u64 first) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | static_cast<uintptr_t>(n)) & 15) != 0) {
    return copy_chunk_portable<kChecksum>(dst, src, n, first);
  }
  const __m128i low = _mm_set1_epi64x(0xFFFFFFFF);
  __m128i a_even = _mm_setzero_si128(), a_odd = a_even, c_even = a_even, c_odd = a_even;
  const int64_t vectors = n / 16;
#pragma GCC unroll 4
  for (int64_t t = 0; t < vectors; ++t) {
    const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(src + 16 * t));
    if constexpr (kStream) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16 * t), v);
    } else {
      _mm_store_si128(reinterpret_cast<__m128i*>(dst + 16 * t), v);
    }
    if constexpr (kChecksum) {
      a_even = _mm_add_epi64(a_even, _mm_and_si128(v, low));
      a_odd = _mm_add_epi64(a_odd, _mm_srli_epi64(v, 32));
      c_even = _mm_add_epi64(c_even, a_even);
      c_odd = _mm_add_epi64(c_odd, a_odd);
    }
  }
  if constexpr (!kChecksum) {
    return 0;
  }
  alignas(16) u64 lanes[4][2];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes[0]), a_even);
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes[1]), a_odd);
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes[2]), c_even);
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes[3]), c_odd);
  const u64 a[4] = {lanes[0][0], lanes[1][0], lanes[0][1], lanes[1][1]};
  const u64 c[4] = {lanes[2][0], lanes[3][0], lanes[2][1], lanes[3][1]};
  return finish_lanes(a, c, 4, vectors, first);
}
#endif

// Copies one chunk of `n` bytes and returns its checksum contribution (0 when not asked for).
using ChunkCopy = u64 (*)(uint8_t* dst, const uint8_t* src, int64_t n, u64 first);

template <bool kChecksum, bool kStream>
ChunkCopy pick_chunk_copy() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 ? &copy_chunk_avx2<kChecksum, kStream> : &copy_chunk_sse2<kChecksum, kStream>;
#else
  return &copy_chunk_portable<kChecksum>;
#endif
}

// Hints the first (up to 8) cache lines of a chunk into cache.
inline void prefetch_chunk(const uint8_t* p, int64_t n) {
  const int64_t span = std::min<int64_t>(n, 512);
  for (int64_t i = 0; i < span; i += 64) {
    __builtin_prefetch(p + i, 0, 3);
  }
}

constexpr int64_t kPrefetchChunks = 8;

// Transfers at least this large use streaming stores (see copy_chunk_sse2); smaller ones may be read from cache.
constexpr int64_t kStreamBytes = int64_t{8} << 20;

// The pool side of a transfer, unpacked from the tables that kernels/layout.py builds.
struct Geometry {
  std::vector<uint8_t*> base;   // buffer base addresses, record order
  std::vector<int64_t> chunk;   // bytes of one page of each buffer
  std::vector<int64_t> offset;  // byte offset of each buffer's chunk inside a record
  int64_t page_bytes = 0;
};

Geometry unpack(const at::Tensor& ptrs, const at::Tensor& chunks) {
  TORCH_CHECK(ptrs.device().is_cpu() && ptrs.scalar_type() == at::kLong && ptrs.dim() == 1 && ptrs.is_contiguous(),
              "ptrs must be a contiguous CPU int64 vector");
  const int64_t nb = ptrs.numel();
  TORCH_CHECK(chunks.device().is_cpu() && chunks.scalar_type() == at::kLong && chunks.is_contiguous() &&
                  chunks.dim() == 2 && chunks.size(0) == 2 && chunks.size(1) == nb,
              "chunks must be a contiguous CPU int64 [2, num_buffers] table");
  Geometry g;
  const int64_t* p = ptrs.data_ptr<int64_t>();
  const int64_t* c = chunks.data_ptr<int64_t>();
  for (int64_t b = 0; b < nb; ++b) {
    TORCH_CHECK(c[b] > 0 && c[b] % 4 == 0, "chunk ", b, " has ", c[b], " bytes, not a positive multiple of 4");
    g.base.push_back(reinterpret_cast<uint8_t*>(p[b]));
    g.chunk.push_back(c[b]);
    g.offset.push_back(c[nb + b]);
    g.page_bytes += c[b];
  }
  return g;
}

const int64_t* checked_pages(const at::Tensor& pages, int64_t pool_pages) {
  TORCH_CHECK(pages.device().is_cpu() && pages.scalar_type() == at::kLong && pages.dim() == 1 && pages.is_contiguous(),
              "page indices must be a contiguous CPU int64 vector");
  const int64_t* idx = pages.data_ptr<int64_t>();
  for (int64_t j = 0; j < pages.numel(); ++j) {
    TORCH_CHECK(idx[j] >= 0 && idx[j] < pool_pages, "page index ", idx[j], " at position ", j,
                " is outside the pool's ", pool_pages, " pages");
  }
  return idx;
}

enum class Direction { kExport, kImport };

template <Direction kDir, bool kChecksum, bool kStream>
void move_records(const Geometry& g, const int64_t* pages, int64_t n, uint8_t* records, int64_t* sums) {
  const auto nb = static_cast<int64_t>(g.base.size());
  const ChunkCopy copy = pick_chunk_copy<kChecksum, kStream>();
  // A task should move a few hundred KiB so that small requests do not pay for waking every thread.
  const int64_t grain = std::max<int64_t>(1, (int64_t{256} << 10) / g.page_bytes);
  // Chunks this small are latency-bound gathers (see prefetch_chunk); larger ones stream by themselves.
  const bool small_chunks = *std::max_element(g.chunk.begin(), g.chunk.end()) <= 4096;
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    // Position (record, buffer) of the chunk being prefetched, kPrefetchChunks ahead of the one being copied.
    int64_t ahead_j = begin + kPrefetchChunks / nb;
    int64_t ahead_b = kPrefetchChunks % nb - 1;
    for (int64_t j = begin; j < end; ++j) {
      uint8_t* record = records + j * g.page_bytes;
      u64 sum = 0;
      for (int64_t b = 0; b < nb; ++b) {
        if (kDir == Direction::kExport && small_chunks) {
          // Small chunks from scattered pages defeat the hardware prefetcher; ask for the chunk kPrefetchChunks
          // ahead (in this task's order) now. Prefetching a whole record ahead measured slower than none at all:
          // the requests pile up in the core's miss buffers and delay the loads that are due.
          if (++ahead_b == nb) {
            ahead_b = 0;
            ++ahead_j;
          }
          if (ahead_j < end) {
            prefetch_chunk(g.base[ahead_b] + pages[ahead_j] * g.chunk[ahead_b], g.chunk[ahead_b]);
          }
        }
        uint8_t* pool = g.base[b] + pages[j] * g.chunk[b];
        uint8_t* dst = kDir == Direction::kExport ? record + g.offset[b] : pool;
        const uint8_t* src = kDir == Direction::kExport ? pool : record + g.offset[b];
        sum += copy(dst, src, g.chunk[b], static_cast<u64>(g.offset[b] / 4));
      }
      if constexpr (kChecksum) {
        sums[j] = static_cast<int64_t>(sum);  // same bits as the u64 sum
      }
    }
#if defined(__x86_64__)
    if constexpr (kStream) {
      _mm_sfence();  // streaming stores are weakly ordered: publish them before the task ends
    }
#endif
  });
}

template <Direction kDir>
void run(const Geometry& g, const int64_t* pages, int64_t n, uint8_t* records, int64_t* sums) {
  const bool stream = n * g.page_bytes >= kStreamBytes;
  if (sums != nullptr) {
    stream ? move_records<kDir, true, true>(g, pages, n, records, sums)
           : move_records<kDir, true, false>(g, pages, n, records, sums);
  } else {
    stream ? move_records<kDir, false, true>(g, pages, n, records, sums)
           : move_records<kDir, false, false>(g, pages, n, records, sums);
  }
}

template <Direction kDir>
void dispatch(const at::Tensor& ptrs, const at::Tensor& chunks, const at::Tensor& pages, int64_t pool_pages,
              const at::Tensor& records, const at::Tensor& sums) {
  const Geometry g = unpack(ptrs, chunks);
  const int64_t* idx = checked_pages(pages, pool_pages);
  const int64_t n = pages.numel();
  TORCH_CHECK(records.device().is_cpu() && records.scalar_type() == at::kByte && records.is_contiguous() &&
                  records.numel() == n * g.page_bytes,
              "transfer buffer must be a contiguous CPU uint8 tensor of ", n * g.page_bytes, " bytes, got ",
              records.numel());
  const bool with_sums = sums.numel() > 0;
  TORCH_CHECK(!with_sums || (sums.device().is_cpu() && sums.scalar_type() == at::kLong && sums.is_contiguous() &&
                             sums.numel() == n),
              "checksums must be an empty tensor or a contiguous CPU int64 vector of ", n);
  run<kDir>(g, idx, n, records.data_ptr<uint8_t>(), with_sums ? sums.data_ptr<int64_t>() : nullptr);
}

// Gathers pool pages into `out` (page-first records); fills `sums` with per-record checksums unless it is empty.
void export_pages(const at::Tensor& ptrs, const at::Tensor& chunks, const at::Tensor& pages, int64_t pool_pages,
                  const at::Tensor& out, const at::Tensor& sums) {
  dispatch<Direction::kExport>(ptrs, chunks, pages, pool_pages, out, sums);
}

// Scatters the records of `data` into pool pages; fills `sums` with the checksums of what was written.
void import_pages(const at::Tensor& ptrs, const at::Tensor& chunks, const at::Tensor& pages, int64_t pool_pages,
                  const at::Tensor& data, const at::Tensor& sums) {
  dispatch<Direction::kImport>(ptrs, chunks, pages, pool_pages, data, sums);
}

}  // namespace

TORCH_LIBRARY(prorsa_kv_cpu, m) {
  m.def("export_pages(Tensor ptrs, Tensor chunks, Tensor pages, int pool_pages, Tensor(a!) out, Tensor(b!) sums) -> ()",
        &export_pages);
  m.def("import_pages(Tensor ptrs, Tensor chunks, Tensor pages, int pool_pages, Tensor data, Tensor(b!) sums) -> ()",
        &import_pages);
}

// memory.cuh — moving tiles between global memory, shared memory and registers.
//
// Provides:
//   Vec16<T>, load16 / store16           one 16-byte (uint4) access
//   store16_global                       one st.global.v4 where the compiler cannot prove the alignment
//   load16_shifted                       16 bytes at any address: the one or two aligned lines
//                                        they span, joined by funnel shifts
//   load_vec / store_vec                 16 bytes of a row with a bounds-checked scalar fallback
//                                        for the row's tail and for unaligned addresses
//   load_vec_al / store_vec_al           the same where the caller knows the row aligned (and
//                                        every chunk inside it): no check per chunk
//   values_to_boundary / load_vec_rot /  a row that starts between two 16-byte boundaries: the
//   load_vec_rot_own / store_vec_rot /   values before the first boundary, and 16 bytes of a grid
//   store_vec_rot_own                    rotated by them (whole chunks aligned; the head comes last)
//   load_vec_sh / store_vec_sh           a row on a grid shifted back to the 16-byte boundary at or
//                                        before its start: col may be negative (values before the row)
//   cache_chunk_async / load_cached      chunk k of a row kept in shared memory (k < n; zeros past):
//                                        copied by cp.async where aligned, read back
//   smem_addr                            a shared-memory pointer as the 32-bit address PTX wants
//   cp_async16                           cp.async.cg 16-byte copy global -> shared; the bytes past
//                                        src_bytes are zero-filled (src_bytes = 0: all zeros, and
//                                        the source is not read)
//   cp_async_commit / cp_async_wait<N> / cp_async_wait_all / pipeline_wait<STAGES>
//                                        commit groups for multi-stage pipelines
//   cp_async_wait_upto                   cp_async_wait with a count known at run time
//   load_tile_async / load_tile          a ROWS x COLS tile global -> shared, zero outside the
//                                        valid rows x cols
//   store_tile                           a ROWS x COLS tile shared -> global, only the valid part
//
// A multi-stage pipeline with one commit group per stage reads:
//   for (s = 0; s < STAGES - 1; ++s) { if (s < n) load(s % STAGES, s); cp_async_commit(); }
//   for (k = 0; k < n; ++k) {
//     pipeline_wait<STAGES>();                   // stage k has landed; slot (k-1) % STAGES is free
//     if (k + STAGES - 1 < n) load((k + STAGES - 1) % STAGES, k + STAGES - 1);
//     cp_async_commit();                         // commit even when empty: keeps the count
//     compute(k % STAGES);
//   }
#ifndef NAPKIN_MEMORY_CUH
#define NAPKIN_MEMORY_CUH

#include "types.cuh"

namespace napkin {

// 16 bytes of T, aligned so that it moves as one uint4.
template <typename T>
struct __align__(16) Vec16 {
  static constexpr int size = 16 / static_cast<int>(sizeof(T));
  T x[16 / sizeof(T)];
};

NAPKIN_DEVICE uint4 load16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
NAPKIN_DEVICE void store16(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

// store16 of global memory as one st.global.v4, where the compiler cannot tell the address is on a
// 16-byte boundary: a row rotated to its lines (load_vec_rot) checks that at run time, and nvcc 13
// wrote store16 there as four scalar stores (a softmax over 65536 fp32 rows of 77 values took
// 38.4 us on an H200, against 10.7 for rows of 80, whose stores it could prove aligned).
NAPKIN_DEVICE void store16_global(void* p, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n"
               ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// The 16 bytes at p wherever p sits in its 16-byte line: the aligned line at or before p and, where
// p is not on a boundary and bytes past that line are wanted (nbytes > 16 - offset), the next one,
// joined by funnel shifts of their words. Two vector loads where an unaligned vector would take one
// scalar load a value (each, with lanes 16 bytes apart, four L1 wavefronts). Bytes at nbytes and
// past are unspecified; no line holding none of the bytes p[0 .. nbytes) is read (nbytes >= 1).
NAPKIN_DEVICE uint4 load16_shifted(const void* p, int nbytes) {
  const unsigned long long a = reinterpret_cast<unsigned long long>(p);
  const int off = static_cast<int>(a & 15ull);           // bytes into the line
  const uint4* line = reinterpret_cast<const uint4*>(a - static_cast<unsigned long long>(off));
  const uint4 lo = line[0];
  const uint4 hi = (off != 0 && nbytes > 16 - off) ? line[1] : make_uint4(0u, 0u, 0u, 0u);
  const unsigned int w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  const int ws = off >> 2, bits = (off & 3) * 8;         // whole words, then bits, to shift by
  unsigned int r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const unsigned int x0 = ws == 0 ? w[j] : ws == 1 ? w[j + 1] : ws == 2 ? w[j + 2] : w[j + 3];
    const unsigned int x1 = ws == 0 ? w[j + 1] : ws == 1 ? w[j + 2] : ws == 2 ? w[j + 3] : w[j + 4];
    r[j] = __funnelshift_r(x0, x1, bits);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// v = row[col .. col + size); elements at index >= limit read as `fill`. One 16-byte load when the
// whole vector is inside the row and its address is 16-byte aligned, scalar loads otherwise (not
// load16_shifted: on an H200 it took a norm backward over 4096 x 4095 bf16 from 105 to 111 us of
// kernel, though a streamed log-softmax over rows of 70001 went from 46 to 41).
template <typename T>
NAPKIN_DEVICE void load_vec(Vec16<T>& v, const T* row, int col, int limit, T fill) {
  constexpr int N = Vec16<T>::size;
  const T* p = row + col;
  if (col + N <= limit && is_aligned(p, 16)) {
    *reinterpret_cast<uint4*>(v.x) = load16(p);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v.x[i] = (col + i < limit) ? p[i] : fill;
  }
}

// load_vec where the caller knows more (a row kernel's two paths): AL, that row + col is 16-byte
// aligned wherever the chunk is inside the row (every array starts on a 16-byte boundary and a row
// is whole vectors); with EVEN too, that limit is 0 (no row: `fill`) or covers the chunk. Then one
// 16-byte load under the row's own check, no check per chunk; otherwise load_vec.
template <bool AL, bool EVEN, typename T>
NAPKIN_DEVICE void load_vec_al(Vec16<T>& v, const T* row, int col, int limit, T fill) {
  constexpr int N = Vec16<T>::size;
  if constexpr (AL && EVEN) {
    if (limit > 0) {
      *reinterpret_cast<uint4*>(v.x) = load16(row + col);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v.x[i] = fill;
    }
  } else if constexpr (AL) {
    if (col + N <= limit) {
      *reinterpret_cast<uint4*>(v.x) = load16(row + col);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v.x[i] = (col + i < limit) ? row[col + i] : fill;
    }
  } else {
    load_vec(v, row, col, limit, fill);
  }
}

// Values of T from p up to the first 16-byte boundary at or after it (0 when p is aligned).
template <typename T>
NAPKIN_DEVICE int values_to_boundary(const T* p) {
  return static_cast<int>(((16 - reinterpret_cast<unsigned long long>(p) % 16) % 16) / sizeof(T));
}

// A row of `limit` values read on a rotated grid: grid position q holds column (q + rot) mod limit,
// so that where the row starts rot values before a 16-byte boundary, every whole chunk of the grid
// is one aligned access and the values before the boundary come last, with the row's tail (one
// chunk, loaded value by value). v = the columns of positions q .. q + size; positions at or past
// limit read as `fill`. rot is in [0, limit) or the row is empty (limit = 0). `body`: the caller
// knows the chunk lies inside the row wherever the row exists (q + rot + size <= limit, or
// limit = 0), so no value wraps or leaves the row: cheaper code (fewer registers) when it folds.
template <typename T>
NAPKIN_DEVICE void load_vec_rot(Vec16<T>& v, const T* row, int q, int rot, int limit, T fill, bool body) {
  constexpr int N = Vec16<T>::size;
  const int col = q + rot;
  if (body) {
    if (limit > 0 && is_aligned(row + col, 16)) {
      *reinterpret_cast<uint4*>(v.x) = load16(row + col);
    } else if (sizeof(T) == 2 && limit > 0) {
      // inside the row, an array that starts elsewhere in its lines than the rotation's own (gamma
      // beside X): 16-bit values still move 16 bytes at a time (fp32 keeps its four scalar loads,
      // measured faster beside the pointwise family's shifted vector)
      *reinterpret_cast<uint4*>(v.x) = load16_shifted(row + col, 16);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v.x[i] = limit > 0 ? row[col + i] : fill;
    }
  } else if (col + N <= limit && is_aligned(row + col, 16)) {
    *reinterpret_cast<uint4*>(v.x) = load16(row + col);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int c = col + i >= limit ? col + i - limit : col + i;
      v.x[i] = q + i < limit ? row[c] : fill;
    }
  }
}

// load_vec_rot of the array whose row fixed rot (it starts rot values before a 16-byte boundary,
// values_to_boundary): a chunk inside the row (`body`) is one aligned load, with no check.
template <typename T>
NAPKIN_DEVICE void load_vec_rot_own(Vec16<T>& v, const T* row, int q, int rot, int limit, T fill, bool body) {
  if (body) {
    if (limit > 0) {
      *reinterpret_cast<uint4*>(v.x) = load16(row + q + rot);
    } else {
#pragma unroll
      for (int i = 0; i < Vec16<T>::size; ++i) v.x[i] = fill;
    }
  } else {
    load_vec_rot(v, row, q, rot, limit, fill, false);
  }
}

// store_vec on a rotated grid (see load_vec_rot): writes positions q .. q + size below limit.
template <typename T>
NAPKIN_DEVICE void store_vec_rot(T* row, int q, int rot, int limit, const Vec16<T>& v, bool body) {
  constexpr int N = Vec16<T>::size;
  const int col = q + rot;
  if (body) {
    if (limit > 0) {
      if (is_aligned(row + col, 16)) {
        store16_global(row + col, *reinterpret_cast<const uint4*>(v.x));
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) row[col + i] = v.x[i];
      }
    }
  } else if (col + N <= limit && is_aligned(row + col, 16)) {
    store16_global(row + col, *reinterpret_cast<const uint4*>(v.x));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int c = col + i >= limit ? col + i - limit : col + i;
      if (q + i < limit) row[c] = v.x[i];
    }
  }
}

// store_vec_rot of an array known to start where the rotation's own array does in its 16-byte lines
// (a row kernel with column reductions checks this once a block): a chunk inside the row (`body`)
// is one aligned store, with no check.
template <typename T>
NAPKIN_DEVICE void store_vec_rot_own(T* row, int q, int rot, int limit, const Vec16<T>& v, bool body) {
  if (body) {
    if (limit > 0) store16_global(row + q + rot, *reinterpret_cast<const uint4*>(v.x));
  } else {
    store_vec_rot(row, q, rot, limit, v, false);
  }
}

// row[col .. col + size) = v, writing only the elements at index < limit.
template <typename T>
NAPKIN_DEVICE void store_vec(T* row, int col, int limit, const Vec16<T>& v) {
  constexpr int N = Vec16<T>::size;
  T* p = row + col;
  if (col + N <= limit && is_aligned(p, 16)) {
    store16(p, *reinterpret_cast<const uint4*>(v.x));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (col + i < limit) p[i] = v.x[i];
    }
  }
}

// A row read on a grid shifted to its 16-byte lines (a streamed row that is not whole vectors): the
// grid starts at the boundary at or before the row's first value, so col runs from 1 - size (the
// chunk that holds the row's first value and the values before it) and every chunk inside the
// array's lines is one aligned load. The values before the row (col + i < 0) are read, in the same
// 16-byte line as the row's first value, and must be masked by the caller; those at or past limit
// read as `fill`. A chunk inside the row but off the 16-byte lines (an array that starts elsewhere
// in its lines than the grid's own) moves its 16-bit values by two aligned loads (load16_shifted).
template <typename T>
NAPKIN_DEVICE void load_vec_sh(Vec16<T>& v, const T* row, int col, int limit, T fill) {
  constexpr int N = Vec16<T>::size;
  const T* p = row + col;
  if (col + N <= limit && is_aligned(p, 16)) {
    *reinterpret_cast<uint4*>(v.x) = load16(p);
  } else if (sizeof(T) == 2 && col >= 0 && col + N <= limit) {
    *reinterpret_cast<uint4*>(v.x) = load16_shifted(p, 16);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v.x[i] = (col + i >= 0 && col + i < limit) ? p[i] : fill;
  }
}

// store_vec on load_vec_sh's grid: writes row[col + i] for 0 <= col + i < limit only (the values
// before the row belong to another one).
template <typename T>
NAPKIN_DEVICE void store_vec_sh(T* row, int col, int limit, const Vec16<T>& v) {
  constexpr int N = Vec16<T>::size;
  T* p = row + col;
  if (col >= 0 && col + N <= limit && is_aligned(p, 16)) {
    store16(p, *reinterpret_cast<const uint4*>(v.x));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (col + i >= 0 && col + i < limit) p[i] = v.x[i];
    }
  }
}

// store_vec with load_vec_al's knowledge (AL, EVEN): one 16-byte store under the row's check.
template <bool AL, bool EVEN, typename T>
NAPKIN_DEVICE void store_vec_al(T* row, int col, int limit, const Vec16<T>& v) {
  constexpr int N = Vec16<T>::size;
  if constexpr (AL && EVEN) {
    if (limit > 0) store16(row + col, *reinterpret_cast<const uint4*>(v.x));
  } else if constexpr (AL) {
    if (col + N <= limit) {
      store16(row + col, *reinterpret_cast<const uint4*>(v.x));
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        if (col + i < limit) row[col + i] = v.x[i];
      }
    }
  } else {
    store_vec(row, col, limit, v);
  }
}

// p rounded down to a multiple of 16 bytes.
NAPKIN_DEVICE const void* align_down16(const void* p) {
  return reinterpret_cast<const void*>(reinterpret_cast<u64>(p) & ~static_cast<u64>(15));
}

// The 32-bit shared-state-space address of a pointer into shared memory.
NAPKIN_DEVICE u32 smem_addr(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

// Asynchronous 16-byte copy global -> shared (both 16-byte aligned). The first src_bytes (0..16)
// come from gmem, the rest of the 16 bytes are written as zeros; with src_bytes = 0 nothing is
// read. Completes at the cp_async_wait of the commit group it was issued in.
NAPKIN_DEVICE void cp_async16(void* smem, const void* gmem, int src_bytes = 16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(src_bytes)
               : "memory");
#else
  const unsigned char* s = static_cast<const unsigned char*>(gmem);
  unsigned char* d = static_cast<unsigned char*>(smem);
  for (int i = 0; i < 16; ++i) d[i] = i < src_bytes ? s[i] : 0;
#endif
}

// Closes the group of cp.async copies issued since the last commit.
NAPKIN_DEVICE void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N committed groups are still in flight (this thread's copies only).
template <int N>
NAPKIN_DEVICE void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Waits until at most n of this thread's committed groups are still in flight, n known at run time
// (a loop's step): wait_group takes an immediate, so n past 7 waits for all but 7 (waiting for more
// than asked is always safe).
NAPKIN_DEVICE void cp_async_wait_upto(int n) {
  switch (n <= 0 ? 0 : n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
  }
}

// Waits for every copy this thread issued.
NAPKIN_DEVICE void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// In a STAGES-deep pipeline with one commit group per stage: waits for the oldest stage, then a
// block barrier makes it visible to every thread (and frees the slot computed on last).
template <int STAGES>
NAPKIN_DEVICE void pipeline_wait() {
  static_assert(STAGES >= 2, "a pipeline needs at least two stages");
  cp_async_wait<STAGES - 2>();
  __syncthreads();
}

// The zero of T.
template <typename T>
NAPKIN_DEVICE T zero() { return Traits<T>::from_float(0.f); }

// Chunk k of a row kept in shared memory (`words`: n 16-byte words, k < n), the chunk load_vec_sh
// would load from row[col .. col + size): on a 16-byte boundary by cp.async (the values at or past
// limit zero-filled, a chunk wholly past it not read; completes at the thread's cp_async_wait),
// elsewhere by load_vec_sh and a store now. Read back by load_cached, as zeros past n (the chunks
// of a thread's last step that lie past the row's grid).
template <typename T>
NAPKIN_DEVICE void cache_chunk_async(uint4* words, int k, int n, const T* row, int col, int limit) {
  constexpr int N = Vec16<T>::size;
  if (k >= n) return;
  const T* p = row + col;
  if (is_aligned(p, 16)) {
    const int have = limit - col;  // values from p on that lie inside the row (the ones before it too)
    cp_async16(words + k, p, have >= N ? 16 : have > 0 ? have * static_cast<int>(sizeof(T)) : 0);
  } else {
    Vec16<T> v;
    load_vec_sh(v, row, col, limit, zero<T>());
    words[k] = *reinterpret_cast<const uint4*>(v.x);
  }
}
template <typename T>
NAPKIN_DEVICE void load_cached(Vec16<T>& v, const uint4* words, int k, int n) {
  *reinterpret_cast<uint4*>(v.x) = k < n ? words[k] : make_uint4(0u, 0u, 0u, 0u);
}

// Starts the copy of a ROWS x COLS tile from global memory (row stride g_ld elements, of which
// `rows` x `cols` from the tile's origin exist) into shared memory (row stride s_ld elements; the
// smem rows must be 16-byte aligned). Elements outside the valid part become zero. NTHREADS
// threads share the work, tid in [0, NTHREADS). Whole, aligned 16-byte chunks go through
// cp.async (a chunk that straddles `cols` copies its valid prefix and zero-fills the rest, one
// wholly outside is zero-filled); a chunk whose global address is not 16-byte aligned is copied
// with scalar loads and ordinary shared stores (visible after the next __syncthreads, like the
// rest). ROLLED keeps the loop over a thread's chunks rolled (a kernel whose registers are all
// taken, the persistent wgmma consumers' epilogue, copies without the unrolled chunks' addresses).
template <typename T, int ROWS, int COLS, int NTHREADS, bool ROLLED = false>
NAPKIN_DEVICE void load_tile_async(T* smem, int s_ld, const T* gmem, int g_ld, int rows, int cols,
                                   int tid) {
  constexpr int V = Vec16<T>::size;
  static_assert(COLS % V == 0, "tile columns must be a whole number of 16-byte chunks");
  constexpr int PER_ROW = COLS / V;
  constexpr int CHUNKS = ROWS * PER_ROW;
  constexpr int ITERS = (CHUNKS + NTHREADS - 1) / NTHREADS;
#pragma unroll (ROLLED ? 1 : ITERS)
  for (int it = 0; it < ITERS; ++it) {
    const int c = it * NTHREADS + tid;
    if (CHUNKS % NTHREADS != 0 && c >= CHUNKS) break;
    const int r = c / PER_ROW;
    const int col = (c % PER_ROW) * V;
    T* s = smem + r * s_ld + col;
    const T* g = gmem + static_cast<i64>(r) * g_ld + col;
    const bool inside = r < rows && col < cols;
    if (inside && !is_aligned(g, 16)) {
#pragma unroll
      for (int i = 0; i < V; ++i) s[i] = (col + i < cols) ? g[i] : zero<T>();
    } else {
      // Valid prefix from global, zero-fill for the rest; a chunk wholly outside reads nothing
      // and is pointed at the (16-byte aligned down) tile origin.
      const int n = inside ? (cols - col < V ? cols - col : V) : 0;
      const void* src = inside ? static_cast<const void*>(g) : align_down16(gmem);
      cp_async16(s, src, n * static_cast<int>(sizeof(T)));
    }
  }
}

// The same tile copy done synchronously through registers with 16-byte loads (no cp.async);
// the caller still needs a __syncthreads before other threads read the tile.
template <typename T, int ROWS, int COLS, int NTHREADS>
NAPKIN_DEVICE void load_tile(T* smem, int s_ld, const T* gmem, int g_ld, int rows, int cols,
                             int tid) {
  constexpr int V = Vec16<T>::size;
  static_assert(COLS % V == 0, "tile columns must be a whole number of 16-byte chunks");
  constexpr int PER_ROW = COLS / V;
  constexpr int CHUNKS = ROWS * PER_ROW;
  constexpr int ITERS = (CHUNKS + NTHREADS - 1) / NTHREADS;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int c = it * NTHREADS + tid;
    if (CHUNKS % NTHREADS != 0 && c >= CHUNKS) break;
    const int r = c / PER_ROW;
    const int col = (c % PER_ROW) * V;
    Vec16<T> v;
    if (r < rows) {
      load_vec(v, gmem + static_cast<i64>(r) * g_ld, col, cols, zero<T>());
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) v.x[i] = zero<T>();
    }
    store16(smem + r * s_ld + col, *reinterpret_cast<const uint4*>(v.x));
  }
}

// Writes the valid `rows` x `cols` part of a ROWS x COLS shared-memory tile (row stride s_ld,
// 16-byte aligned rows) to global memory (row stride g_ld); nothing outside it is written.
template <typename T, int ROWS, int COLS, int NTHREADS>
NAPKIN_DEVICE void store_tile(T* gmem, int g_ld, const T* smem, int s_ld, int rows, int cols,
                              int tid) {
  constexpr int V = Vec16<T>::size;
  static_assert(COLS % V == 0, "tile columns must be a whole number of 16-byte chunks");
  constexpr int PER_ROW = COLS / V;
  constexpr int CHUNKS = ROWS * PER_ROW;
  constexpr int ITERS = (CHUNKS + NTHREADS - 1) / NTHREADS;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int c = it * NTHREADS + tid;
    if (CHUNKS % NTHREADS != 0 && c >= CHUNKS) break;
    const int r = c / PER_ROW;
    const int col = (c % PER_ROW) * V;
    if (r < rows && col < cols) {
      Vec16<T> v;
      *reinterpret_cast<uint4*>(v.x) = load16(smem + r * s_ld + col);
      store_vec(gmem + static_cast<i64>(r) * g_ld, col, cols, v);
    }
  }
}

}  // namespace napkin

#endif  // NAPKIN_MEMORY_CUH

// The lightning indexer on Hopper's warpgroup MMA, compiled after indexer.cu (its
// IndexerReq, parameters and query quantisation) and wgmma_common.cu (the descriptor, fences).
// One warpgroup (a block of 128 threads) scores 64 positions at a time for all N heads (32 or 64,
// fixed at compile time): D[64 positions][N heads] = K~ Q^T on wgmma.m64nNk16 (f16 in, fp32
// accumulate, as HMMA sums: the fp8 wgmma's narrower accumulator is not used), eight k-steps
// over the 128 dims, then s_t = scale_t * sum_h w_h relu(D[t][h]).
//   - keys: a chunk's 64 rows (132 B each; pages hold a multiple of 64 positions, so they are
//     one contiguous 8448-byte run) are copied by cp.async into one of WGI_STAGES (four) staging
//     tiles, three chunks ahead of their use; each thread reads its two rows' words and converts e4m3 pairs
//     to f16 pairs (exact) straight into the A fragments (registers);
//   - queries (B, K-major in shared memory, no swizzle): exact ones as bf16 times the request's
//     power of two into f16 range (as indexer_scores), fp8 ones quantised per head to e4m3 (as
//     indexer_scores_fp8, the scale folded into the head's weight), both exact in f16.
// The dims are permuted as in indexer_scores (the dot product is order-free): thread (g, tig)
// of warp w holds dims 32 tig .. 32 tig + 31 of rows 16 w + g and + 8; k-step s takes its word
// s (dims 32 tig + 4 s .. + 3) as a0 = (+0, +1) and a2 = (+2, +3) of the first row, a1 and a3
// of the second; query dim d = 32 T + 4 s + 2 h + j therefore sits at k = 8 h + 2 T + j of
// k-step s.
//
// Invariant: 128 threads; N is 32 or 64; page_tokens a positive multiple of 64 (the launcher checks);
// dynamic shared memory as the launcher's `indexer_wg_smem(N)` says (WGI_TILE and WGI_STAGES:
// the generated prelude).

__device__ __forceinline__ void wgi_cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}

// D[64][N] (+)= A . B, A (f16) in registers, B (f16) K-major in shared memory.
template <unsigned N>
__device__ __forceinline__ void wgmma_f16_rs(float* d, const unsigned* a, unsigned long long b, int acc);

template <>
__device__ __forceinline__ void wgmma_f16_rs<64>(float* d, const unsigned* a, unsigned long long b, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}

template <>
__device__ __forceinline__ void wgmma_f16_rs<32>(float* d, const unsigned* a, unsigned long long b, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}

// Byte offset of query (head n, dim d) in the B operand: k-step s = (d % 32) / 4 holds N x 16
// values (two 8x8 core matrices of 16-byte rows along K, 128 B apart; 8-head groups 256 B
// apart), at k = 8 * ((d % 4) / 2) + 2 * (d / 32) + d % 2.
template <unsigned N>
__device__ __forceinline__ unsigned wgi_q_offset(unsigned n, unsigned d) {
    const unsigned s = (d % 32) / 4, k = 8 * ((d % 4) / 2) + 2 * (d / 32) + d % 2;
    return s * N * 32 + (n / 8) * 256 + (k / 8) * 128 + (n % 8) * 16 + (k % 8) * 2;
}

template <bool FP8, unsigned N>
__device__ __forceinline__ void indexer_wg_body(INDEXER_PARAMS) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* qs = smem;                                   // B: 8 k-steps x N x 32 B
    float* w = reinterpret_cast<float*>(smem + N * 256);        // [N]
    unsigned char* stage = smem + N * 256 + N * 4;              // [WGI_STAGES][64 rows][132 B]
    const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
    const unsigned i = blockIdx.y;
    const IndexerReq r = reqs[i];
    const __nv_bfloat16* q = queries + (size_t)i * N * DIM;
    __shared__ float amax_w[WARPS];
    float down = 1.f;
    if (!FP8) {
        // As indexer_scores: the request's largest |q| moved into [2^13, 2^14) by 2^e.
        const int ex = exact_query_exponent(q, N * DIM, amax_w);
        const float up = ldexpf(1.f, ex);
        down = ldexpf(1.f, -ex);
        for (unsigned e = tid; e < N * DIM / 8; e += 128) {
            const uint4 v = reinterpret_cast<const uint4*>(q)[e];
            const __nv_bfloat16* b = reinterpret_cast<const __nv_bfloat16*>(&v);
            #pragma unroll
            for (unsigned j = 0; j < 8; ++j)
                *reinterpret_cast<__half*>(qs + wgi_q_offset<N>(8 * e / DIM, 8 * e % DIM + j)) =
                    __float2half_rn(__bfloat162float(b[j]) * up);
        }
        for (unsigned h = tid; h < N; h += 128) w[h] = weights[(size_t)i * N + h];
    } else {
        // As indexer_scores_fp8: a warp per head, lane j quantises dims 4 j .. 4 j + 3.
        for (unsigned h = warp; h < N; h += WARPS) {
            int ex;
            const unsigned word = fp8_head_codes(q + (size_t)h * DIM, lane, &ex);
            #pragma unroll
            for (unsigned j = 0; j < 4; ++j) {
                const __nv_fp8_storage_t c = (__nv_fp8_storage_t)(word >> (8 * j));
                const __half_raw hr = __nv_cvt_fp8_to_halfraw(c, __NV_E4M3);  // exact
                *reinterpret_cast<__half_raw*>(qs + wgi_q_offset<N>(h, 4 * lane + j)) = hr;
            }
            if (lane == 0) w[h] = weights[(size_t)i * N + h] * ldexpf(1.f, ex);
        }
    }
    fence_async_shared();
    __syncthreads();
    // Each thread's heads' weights: columns 8 j + 2 tig and + 1 of the accumulator.
    float wr[N / 4];
    #pragma unroll
    for (unsigned j = 0; j < N / 8; ++j) {
        wr[2 * j] = w[8 * j + 2 * tig];
        wr[2 * j + 1] = w[8 * j + 2 * tig + 1];
    }

    const unsigned chunks = (r.seq_len + 63) / 64, stride = gridDim.x;
    // Chunks per page, and its shift where a power of two (the usual page sizes), so that the
    // chunk's page and place in it take no division per chunk.
    const unsigned cpp = page_tokens / 64;
    const bool cpp_pow2 = (cpp & (cpp - 1)) == 0;
    const unsigned cpp_lg = __ffs(cpp) - 1;
    auto page_index = [&](unsigned c) -> unsigned { return cpp_pow2 ? c >> cpp_lg : c / cpp; };
    auto page_chunk = [&](unsigned c) -> unsigned { return cpp_pow2 ? c & (cpp - 1) : c % cpp; };
    // The page of chunk c, loaded a chunk before its copies are issued and checked only there,
    // so that nothing waits for the load in between.
    auto page_of = [&](unsigned c) -> unsigned { return c < chunks ? page_table[r.first_page + page_index(c)] : 0u; };
    // Copies chunk c's rows into staging tile `buf` (zeros on a bad page: its scores read 0);
    // one commit group per call, so that wait_group counts chunks.
    auto issue = [&](unsigned c, unsigned page, unsigned buf) {
        unsigned char* dst = stage + buf * WGI_TILE;
        if (c < chunks && page < pool_pages) {
            // 528 copies of 16 bytes: four per thread, and one more for the first 16 threads.
            const unsigned char* src = keys + ((size_t)page * page_tokens + 64 * page_chunk(c)) * KEY_BYTES + 16 * tid;
            unsigned char* to = dst + 16 * tid;
            #pragma unroll
            for (unsigned k = 0; k < 4; ++k) wgi_cp_async16(to + 2048 * k, src + 2048 * k);
            if (tid < WGI_TILE / 16 - 512) wgi_cp_async16(to + 8192, src + 8192);
        } else if (c < chunks) {
            if (tid == 0) atomicOr(fault, 1u);
            for (unsigned e = tid; e < WGI_TILE / 16; e += 128) *reinterpret_cast<uint4*>(dst + 16 * e) = make_uint4(0, 0, 0, 0);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    unsigned c = blockIdx.x;
    // The first WGI_STAGES - 1 chunks in flight before the loop, the next one each iteration.
    #pragma unroll
    for (unsigned b = 0; b + 1 < WGI_STAGES; ++b) issue(c + b * stride, page_of(c + b * stride), b);
    unsigned ahead = page_of(c + (WGI_STAGES - 1) * stride);
    float acc[N / 2];
    #pragma unroll
    for (unsigned j = 0; j < N / 2; ++j) acc[j] = 0.f;
    const unsigned r0 = 16 * warp + g;
    // The queries' descriptor for k-step 0; k-step s's is s * N * 32 bytes on (the address field,
    // in 16-byte units, does not overflow inside shared memory).
    const unsigned long long qdesc = wgmma_desc(qs, 128, 256, 0);
    for (unsigned it = 0; c < chunks; c += stride, ++it) {
        issue(c + (WGI_STAGES - 1) * stride, ahead, (it + WGI_STAGES - 1) % WGI_STAGES);
        ahead = page_of(c + WGI_STAGES * stride);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(WGI_STAGES - 1));
        __syncthreads();  // chunk c's rows (every thread's copies) landed
        const unsigned char* tile = stage + (it % WGI_STAGES) * WGI_TILE;
        const unsigned* row0 = reinterpret_cast<const unsigned*>(tile + r0 * KEY_BYTES);
        const unsigned* row1 = reinterpret_cast<const unsigned*>(tile + (r0 + 8) * KEY_BYTES);
        // Every k-step's A fragment first, so that the eight wgmmas issue back to back.
        unsigned a[8][4];
        #pragma unroll
        for (unsigned s = 0; s < 8; ++s) {
            const unsigned k0 = row0[8 * tig + s], k1 = row1[8 * tig + s];
            a[s][0] = f16x2_from_e4m3x2((unsigned short)(k0 & 0xffff));
            a[s][1] = f16x2_from_e4m3x2((unsigned short)(k1 & 0xffff));
            a[s][2] = f16x2_from_e4m3x2((unsigned short)(k0 >> 16));
            a[s][3] = f16x2_from_e4m3x2((unsigned short)(k1 >> 16));
        }
        wgmma_fence();
        #pragma unroll
        for (unsigned s = 0; s < 8; ++s) wgmma_f16_rs<N>(acc, a[s], qdesc + (s * N * 32) / 16, s > 0);
        wgmma_commit();
        wgmma_wait_all();
        // Two sums per row (even and odd head columns), so that the dependent chains are short.
        float u[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
        #pragma unroll
        for (unsigned j = 0; j < N / 8; ++j) {
            #pragma unroll
            for (unsigned hf = 0; hf < 2; ++hf) {
                u[hf][0] = fmaf(wr[2 * j], fmaxf(acc[4 * j + 2 * hf], 0.f), u[hf][0]);
                u[hf][1] = fmaf(wr[2 * j + 1], fmaxf(acc[4 * j + 2 * hf + 1], 0.f), u[hf][1]);
            }
        }
        float v[2] = {u[0][0] + u[0][1], u[1][0] + u[1][1]};
        #pragma unroll
        for (unsigned hf = 0; hf < 2; ++hf) {
            v[hf] += __shfl_xor_sync(0xffffffffu, v[hf], 1);
            v[hf] += __shfl_xor_sync(0xffffffffu, v[hf], 2);
            const unsigned rr = r0 + 8 * hf, pos = 64 * c + rr;
            if (tig == 0 && pos < r.seq_len) {
                const float scale = *reinterpret_cast<const float*>(tile + rr * KEY_BYTES + KEY_DIM) * down;
                scores[r.score_offset + pos] =
                    pin_newest && pos + 1 == r.seq_len ? __int_as_float(0x7f800000) : scale * v[hf];
            }
        }
        __syncthreads();  // every thread's reads of the tile done before it is refilled
    }
    asm volatile("cp.async.wait_all;\n" ::);
}

// Four blocks of the 64-head forms fit an SM (50 KB of shared memory each), five of the 32-head
// ones; the launcher asks the driver and fills one wave.
extern "C" __global__ void __launch_bounds__(128, 4) indexer_scores_wg_h64(INDEXER_PARAMS) {
    indexer_wg_body<false, 64>(INDEXER_ARGS);
}

extern "C" __global__ void __launch_bounds__(128, 5) indexer_scores_wg_h32(INDEXER_PARAMS) {
    indexer_wg_body<false, 32>(INDEXER_ARGS);
}

extern "C" __global__ void __launch_bounds__(128, 4) indexer_scores_fp8_wg_h64(INDEXER_PARAMS) {
    indexer_wg_body<true, 64>(INDEXER_ARGS);
}

extern "C" __global__ void __launch_bounds__(128, 5) indexer_scores_fp8_wg_h32(INDEXER_PARAMS) {
    indexer_wg_body<true, 32>(INDEXER_ARGS);
}

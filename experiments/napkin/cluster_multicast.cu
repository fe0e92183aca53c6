// A thread-block-cluster probe for the napkin's cluster level (issue 36, paper coverage): how many bytes a second
// reach the SMs' shared memory from an L2-resident working set when each block loads its own chunks, and when a
// cluster of c blocks loads each chunk once with a multicast bulk copy (one L2 read, c shared-memory writes).
//
// Written for this probe (triton 3.6's Gluon emits no multicast copy: a cga_layout of [[0, 0]] on a TMA load gives
// each block its own copy). Launched by gpu_cluster_multicast.py through the driver API with a cluster dimension.
//
// One warp is the producer (its lane 0 issues the copies into a ring of `stages` chunk buffers), one the consumer
// (it waits for a chunk, reads one word of it, or in the check mode sums every 32-bit word, and frees the buffer).
// With multicast, buffer s of every block of a cluster is filled by block s % c's copy, which waits until all c
// blocks have freed that buffer (each consumer arrives on the issuer's `empty` barrier remotely). multicast = 1 makes
// that arrive a cluster-scope release and the issuer's wait a cluster-scope acquire; multicast = 2 uses the
// instructions' default (CTA) scope for both, the form CUTLASS's ClusterBarrier uses: is the multicast chunk's cost
// the cluster-scope fence or the copy?
// Without multicast, `group` blocks in a row follow one chunk sequence (stream = block / group), so up to `group`
// SMs read the same lines at about the same time, as a GEMM's concurrent tiles read one operand panel.
#include <cstdint>

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ uint32_t cluster_size() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Spins until the barrier's phase `parity` completes; past 2^22 tries (about a second) it flags the block and traps, so a
// protocol error ends the run instead of hanging it.
__device__ __forceinline__ void wait_parity(uint32_t bar, uint32_t parity, unsigned *flag, bool cluster_scope) {
    for (uint32_t tries = 0;; ++tries) {
        uint32_t done;
        if (cluster_scope) {
            asm volatile("{\n\t.reg .pred p;\n\t"
                         "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        } else {
            asm volatile("{\n\t.reg .pred p;\n\t"
                         "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        }
        if (done) return;
        if (tries > (1u << 22)) {
            atomicExch(flag, 1u + blockIdx.x);
            __trap();
        }
    }
}

// A consumer warp's read of a stage it waited for: every 32-bit word summed (check) or one word (lane 0), so the
// bytes are used and a block that receives nothing fails the check.
__device__ __forceinline__ unsigned long long take_stage(const uint8_t *stage, unsigned bytes, unsigned j, unsigned lane,
                                                         unsigned check) {
    const uint32_t *words = reinterpret_cast<const uint32_t *>(stage);
    unsigned long long total = 0;
    if (check) {
        for (unsigned w = lane; w < bytes / 4; w += 32) total += words[w];
    } else if (lane == 0) {
        total += words[(j * 61) % (bytes / 4)];
    }
    return total;
}

extern "C" __global__ void __launch_bounds__(64)
cluster_multicast_probe(const uint8_t *__restrict__ src, unsigned long long src_chunks, unsigned chunk,
                        unsigned nchunks, unsigned stages, unsigned multicast, unsigned check,
                        unsigned long long *__restrict__ sums, unsigned *__restrict__ flag, unsigned group) {
    extern __shared__ __align__(1024) uint8_t smem[];  // (both kernels: one declaration, the gemm ring's swizzled boxes need 1024)
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem + (size_t)stages * chunk);
    const uint32_t full0 = smem_u32(bars), free0 = smem_u32(bars + stages), empty0 = smem_u32(bars + 2 * stages);
    const uint32_t c = multicast ? cluster_size() : 1u, rank = multicast ? cluster_rank() : 0u;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bool light = multicast == 2u;
    // The chunk sequence: a cluster's blocks share one under multicast; otherwise each block has its own.
    uint32_t cid;
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cid));
    const unsigned long long stream = multicast ? cid : blockIdx.x / (group ? group : 1u);

    if (threadIdx.x == 0) {
        for (unsigned s = 0; s < stages; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(full0 + 8 * s));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(free0 + 8 * s));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(empty0 + 8 * s), "r"(c));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    cluster_sync();  // every block's barriers exist before any copy or remote arrive reaches them

    if (warp == 0 && lane == 0) {  // producer
        const uint16_t mask = static_cast<uint16_t>((1u << c) - 1u);
        for (unsigned j = 0; j < nchunks; ++j) {
            const unsigned s = j % stages, lap = j / stages;
            const uint32_t full = full0 + 8 * s, dst = smem_u32(smem + (size_t)s * chunk);
            if (lap > 0) wait_parity(free0 + 8 * s, (lap - 1) & 1, flag, false);  // this block read lap - 1
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(full), "r"(chunk) : "memory");
            const uint8_t *from = src + ((stream * 97ull + j) % src_chunks) * chunk;
            if (!multicast) {
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                             :: "r"(dst), "l"(from), "r"(chunk), "r"(full) : "memory");
            } else if (s % c == rank) {
                if (lap > 0) wait_parity(empty0 + 8 * s, (lap - 1) & 1, flag, !light);  // all c blocks read lap - 1
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                             "[%0], [%1], %2, [%3], %4;"
                             :: "r"(dst), "l"(from), "r"(chunk), "r"(full), "h"(mask) : "memory");
            }
        }
    } else if (warp == 1) {  // consumer
        unsigned long long total = 0;
        for (unsigned j = 0; j < nchunks; ++j) {
            const unsigned s = j % stages, lap = j / stages;
            if (lane == 0) wait_parity(full0 + 8 * s, lap & 1, flag, false);
            __syncwarp();
            total += take_stage(smem + (size_t)s * chunk, chunk, j, lane, check);
            __syncwarp();
            if (lane == 0) {
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(free0 + 8 * s) : "memory");
                if (multicast) {
                    uint32_t remote;
                    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(empty0 + 8 * s), "r"(s % c));
                    if (light)
                        asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
                    else
                        asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(remote)
                                     : "memory");
                }
            }
        }
        for (int off = 16; off > 0; off /= 2) total += __shfl_down_sync(0xffffffffu, total, off);
        if (lane == 0) sums[blockIdx.x] = total;
    }
    __syncwarp();  // the barrier below is .aligned: each warp reconverges first
    cluster_sync();  // no block leaves while a peer may still copy into it or arrive on its barriers
}

// A GEMM's operand traffic without its MMAs: one block an SM walks output tiles in the grouped order (group_m tile
// rows a group) and, for each of a tile's k steps, loads the A box (bm rows x 128 bytes of k) and the B box (bn rows x
// 128 bytes) by tensor TMA into a ring stage; a consumer warp waits for the stage and frees it (reading one word, or in
// the check mode summing every 32-bit word). The bytes the SMs take in from L2 a second where the running tiles share
// their A and B panels, as the GEMM's do. pace: clocks the consumer holds each stage (a GEMM's MMAs on it).
// b_nmajor: B as the GEMM's row-major [K, N] bf16 takes it (a k step is 64 rows of bn * 2 contiguous bytes, loaded as
// bn / 64 boxes of 64 rows x 128 bytes, as Triton splits a [64, bn] box at its 128-byte swizzle) instead of bn rows of
// 128 bytes a k step (K-major).
struct __align__(64) TensorMap { unsigned long long opaque[16]; };

extern "C" __global__ void __launch_bounds__(64)
gemm_ring_probe(const __grid_constant__ TensorMap a_map, const __grid_constant__ TensorMap b_map, unsigned tiles_m,
                unsigned tiles_n, unsigned k_steps, unsigned group_m, unsigned bm, unsigned bn, unsigned stages,
                unsigned check, unsigned long long *__restrict__ sums, unsigned *__restrict__ flag, unsigned pace,
                unsigned b_nmajor) {
    extern __shared__ __align__(1024) uint8_t smem[];  // 128-byte swizzled boxes land on 1024-byte boundaries
    const unsigned stage_bytes = (bm + bn) * 128u;
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem + (size_t)stages * stage_bytes);
    const uint32_t full0 = smem_u32(bars), free0 = smem_u32(bars + stages);
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (unsigned s = 0; s < stages; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(full0 + 8 * s));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(free0 + 8 * s));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const unsigned tiles = tiles_m * tiles_n;
    if (warp == 0 && lane == 0) {  // producer
        unsigned j = 0;
        for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {
            const unsigned group = t / (group_m * tiles_n), first_m = group * group_m;
            const unsigned rows = min(tiles_m - first_m, group_m);
            const int pm = (int)(first_m + t % rows), pn = (int)((t % (group_m * tiles_n)) / rows);
            for (unsigned k = 0; k < k_steps; ++k, ++j) {
                const unsigned s = j % stages, lap = j / stages;
                const uint32_t full = full0 + 8 * s, dst = smem_u32(smem + (size_t)s * stage_bytes);
                if (lap > 0) wait_parity(free0 + 8 * s, (lap - 1) & 1, flag, false);
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(full), "r"(stage_bytes)
                             : "memory");
                asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                             :: "r"(dst), "l"(reinterpret_cast<uint64_t>(&a_map)), "r"((int)(k * 128)), "r"(pm * (int)bm),
                                "r"(full) : "memory");
                if (b_nmajor) {
                    for (unsigned i = 0; i < bn / 64; ++i)
                        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                                     :: "r"(dst + bm * 128u + i * 64u * 128u), "l"(reinterpret_cast<uint64_t>(&b_map)),
                                        "r"((int)((pn * bn * 2 + i * 128))), "r"((int)(k * 64)), "r"(full) : "memory");
                } else {
                    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                                 :: "r"(dst + bm * 128u), "l"(reinterpret_cast<uint64_t>(&b_map)), "r"((int)(k * 128)),
                                    "r"(pn * (int)bn), "r"(full) : "memory");
                }
            }
        }
    } else if (warp == 1) {  // consumer
        unsigned long long total = 0;
        unsigned j = 0;
        for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {
            for (unsigned k = 0; k < k_steps; ++k, ++j) {
                const unsigned s = j % stages, lap = j / stages;
                if (lane == 0) {
                    wait_parity(full0 + 8 * s, lap & 1, flag, false);
                    // pace > 0: hold the stage that many clocks, as a GEMM's MMAs on it would
                    for (const long long t0 = clock64(); pace && clock64() - t0 < (long long)pace;) {
                    }
                }
                __syncwarp();
                total += take_stage(smem + (size_t)s * stage_bytes, stage_bytes, j, lane, check);
                __syncwarp();
                if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(free0 + 8 * s) : "memory");
            }
        }
        for (int off = 16; off > 0; off /= 2) total += __shfl_down_sync(0xffffffffu, total, off);
        if (lane == 0) sums[blockIdx.x] = total;
    }
}

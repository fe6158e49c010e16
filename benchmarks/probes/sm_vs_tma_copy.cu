// Probe (benchmarks/RESULTS.md, "A hand-written CUDA kernel and TMA"): do TMA bulk copies
// (cp.async.bulk) or a plain CUDA kernel move scattered host<->device items faster than the Triton
// kernels? 16k scattered 2 KiB items, K and V, pinned host <-> device, pairs sorted by host index.
// TMA: G blocks, one issuing thread each, `stages` x `per_stage` items in flight through shared
// memory. Plain: 16-byte streaming loads/stores, 4 items in flight per warp. Best of 7, CUDA events.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/probe sm_vs_tma_copy.cu
//   /tmp/probe
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <random>
#include <algorithm>
#include <cstring>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* b) { asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(sa(b))); }
__device__ __forceinline__ void mbar_expect(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(sa(b)), "r"(bytes) : "memory"); }
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t phase) {
  uint32_t done = 0;
  while (!done) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                             : "=r"(done) : "r"(sa(b)), "r"(phase) : "memory"); }
__device__ __forceinline__ void g2s(void* s, const void* g, uint32_t n, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(sa(s)), "l"(g), "r"(n), "r"(sa(b)) : "memory"); }
__device__ __forceinline__ void s2g(void* g, const void* s, uint32_t n) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" :: "l"(g), "r"(sa(s)), "r"(n) : "memory"); }
__device__ __forceinline__ void commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void wait_read0() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// items: n pairs (src_idx, dst_idx); 2 buffers (K, V) per side; item bytes `item`.
__global__ void tma_copy(const char* srcK, const char* srcV, char* dstK, char* dstV,
                         const int64_t* si, const int64_t* di, int n, int item, int per_stage, int stages) {
  extern __shared__ __align__(128) char smem[];
  uint64_t* bars = (uint64_t*)smem;
  char* buf = smem + 128;
  if (threadIdx.x != 0) return;
  for (int s = 0; s < stages; ++s) mbar_init(&bars[s]);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  int total = 2 * n;  // work units: (item j, part p) -> j*2+p
  int groups = (total + per_stage - 1) / per_stage;
  uint32_t phases = 0;
  int issued = blockIdx.x, consumed = blockIdx.x;  // group ids strided by gridDim
  int inflight = 0;
  while (consumed < groups) {
    while (issued < groups && inflight < stages) {
      int s = (issued / gridDim.x) % stages;
      if ((issued / gridDim.x) >= stages) wait_read0();
      int u0 = issued * per_stage, u1 = min(total, u0 + per_stage);
      mbar_expect(&bars[s], (uint32_t)((u1 - u0) * item));
      for (int u = u0; u < u1; ++u) {
        int j = u >> 1; const char* src = (u & 1) ? srcV : srcK;
        g2s(buf + ((size_t)s * per_stage + (u - u0)) * item, src + si[j] * item, item, &bars[s]);
      }
      issued += gridDim.x; inflight++;
    }
    int s = (consumed / gridDim.x) % stages;
    mbar_wait(&bars[s], (phases >> s) & 1); phases ^= (1u << s);
    int u0 = consumed * per_stage, u1 = min(total, u0 + per_stage);
    for (int u = u0; u < u1; ++u) {
      int j = u >> 1; char* dst = (u & 1) ? dstV : dstK;
      s2g(dst + di[j] * item, buf + ((size_t)s * per_stage + (u - u0)) * item, item);
    }
    commit();
    consumed += gridDim.x; inflight--;
  }
  wait_all();
}

// plain SM copy: each warp copies items with 16-byte vector loads, UNROLL items in flight per warp
template <int UNROLL>
__global__ void ldg_copy(const char* srcK, const char* srcV, char* dstK, char* dstV,
                         const int64_t* si, const int64_t* di, int n, int item) {
  int lane = threadIdx.x & 31, warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int nwarps = (gridDim.x * blockDim.x) >> 5;
  int vecs = item / 16;  // per item
  int total = 2 * n;
  for (int u0 = warp * UNROLL; u0 < total; u0 += nwarps * UNROLL) {
    for (int v = lane; v < vecs; v += 32) {
      int4 r[UNROLL];
#pragma unroll
      for (int k = 0; k < UNROLL; ++k) { int u = u0 + k; if (u < total) { int j = u >> 1; const char* s = (u & 1) ? srcV : srcK;
        r[k] = __ldcs((const int4*)(s + si[j] * item) + v); } }
#pragma unroll
      for (int k = 0; k < UNROLL; ++k) { int u = u0 + k; if (u < total) { int j = u >> 1; char* d = (u & 1) ? dstV : dstK;
        __stcs((int4*)(d + di[j] * item) + v, r[k]); } }
    }
  }
}

int main() {
  const int item = 2048, n = 16384;  // 16k tokens, K+V: 64 MiB
  const size_t pool = (size_t)2 * n * item;
  char *hK, *hV, *dK, *dV, *dK2, *dV2;
  CK(cudaHostAlloc(&hK, pool, 0)); CK(cudaHostAlloc(&hV, pool, 0));
  CK(cudaMalloc(&dK, pool)); CK(cudaMalloc(&dV, pool)); CK(cudaMalloc(&dK2, pool)); CK(cudaMalloc(&dV2, pool));
  for (size_t i = 0; i < pool; ++i) { hK[i] = (char)(i * 7 + 1); hV[i] = (char)(i * 13 + 5); }
  std::mt19937 rng(1);
  std::vector<int64_t> ps(2 * n), pd(2 * n);
  for (int i = 0; i < 2 * n; ++i) ps[i] = pd[i] = i;
  std::shuffle(ps.begin(), ps.end(), rng); std::shuffle(pd.begin(), pd.end(), rng);
  std::vector<int64_t> hs(ps.begin(), ps.begin() + n), dd(pd.begin(), pd.begin() + n);
  std::vector<std::pair<int64_t,int64_t>> pr(n); for (int i = 0; i < n; ++i) pr[i] = {hs[i], dd[i]};
  std::sort(pr.begin(), pr.end()); for (int i = 0; i < n; ++i) { hs[i] = pr[i].first; dd[i] = pr[i].second; }
  int64_t *gh, *gd; CK(cudaMalloc(&gh, n * 8)); CK(cudaMalloc(&gd, n * 8));
  CK(cudaMemcpy(gh, hs.data(), n * 8, cudaMemcpyHostToDevice)); CK(cudaMemcpy(gd, dd.data(), n * 8, cudaMemcpyHostToDevice));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  double bytes = 2.0 * n * item;
  auto timeit = [&](auto launch) { for (int w = 0; w < 2; ++w) launch(); CK(cudaStreamSynchronize(st));
    float best = 1e9; for (int r = 0; r < 7; ++r) { cudaEventRecord(a, st); launch(); cudaEventRecord(b, st); CK(cudaEventSynchronize(b));
      float ms; cudaEventElapsedTime(&ms, a, b); best = std::min(best, ms); } return bytes / (best / 1e3) / 1e9; };
  printf("contiguous H2D %.1f GB/s\n", timeit([&] { cudaMemcpyAsync(dK2, hK, (size_t)n * item, cudaMemcpyHostToDevice, st);
                                                    cudaMemcpyAsync(dV2, hV, (size_t)n * item, cudaMemcpyHostToDevice, st); }));
  printf("contiguous D2H %.1f GB/s\n", timeit([&] { cudaMemcpyAsync(hK, dK2, (size_t)n * item, cudaMemcpyDeviceToHost, st);
                                                    cudaMemcpyAsync(hV, dV2, (size_t)n * item, cudaMemcpyDeviceToHost, st); }));
  for (int dir = 0; dir < 2; ++dir) {
    const char *sK = dir ? dK2 : hK, *sV = dir ? dV2 : hV; char *tK = dir ? hK : dK, *tV = dir ? hV : dV;
    const int64_t *si = dir ? gd : gh, *di = dir ? gh : gd;
    const char* name = dir ? "D2H" : "H2D";
    for (int G : {1, 2, 4}) for (int per : {2, 8}) for (int stages : {4, 8}) {
      size_t sm = 128 + (size_t)per * stages * item; if (sm > 227 * 1024) continue;
      CK(cudaFuncSetAttribute(tma_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
      double g = timeit([&] { tma_copy<<<G, 32, sm, st>>>(sK, sV, tK, tV, si, di, n, item, per, stages); });
      CK(cudaGetLastError());
      printf("%s tma G=%d per_stage=%d stages=%d (%zu KiB in flight/CTA): %.1f GB/s\n", name, G, per, stages, (size_t)per * stages * item / 1024, g);
    }
    for (int G : {2, 4}) {
      printf("%s ldg G=%d 1024thr unroll4: %.1f GB/s\n", name, G, timeit([&] { ldg_copy<4><<<G, 1024, 0, st>>>(sK, sV, tK, tV, si, di, n, item); }));
    }
  }
  // verify TMA H2D result
  CK(cudaMemset(dK, 0x5a, pool)); CK(cudaFuncSetAttribute(tma_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, 128 + 8 * 8 * item));
  tma_copy<<<2, 32, 128 + 8 * 8 * item, st>>>(hK, hV, dK, dV, gh, gd, n, item, 8, 8); CK(cudaStreamSynchronize(st));
  std::vector<char> back(pool); CK(cudaMemcpy(back.data(), dK, pool, cudaMemcpyDeviceToHost));
  long bad = 0; for (int i = 0; i < n; ++i) bad += memcmp(back.data() + dd[i] * item, hK + hs[i] * item, item) != 0;
  printf("verify H2D tma: %ld bad items of %d\n", bad, n);
  return 0;
}

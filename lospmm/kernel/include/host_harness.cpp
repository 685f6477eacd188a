#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#ifdef LOSPMM_COOPERATIVE
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
// A block whose threads meet at __syncthreads runs each thread on a thread of its own, one at a time in
// index order, each until its next barrier (or its end); when every thread is at the barrier or done,
// the barrier opens and the order starts again from the lowest. Deterministic, and as hostile to a
// missing barrier as a schedule can be: a thread always runs ahead of the ones that write what it reads.
// The block's threads are made once and run every block in turn (a block's threads made and joined per
// block cost a sliced kernel of 1000 tiles minutes under ASan): the main thread starts a block (its
// generation) and waits until every thread is done with it. A kernel's thread_local state (mma.cuh's
// exchange turns and queues) so carries from one block to the next: each lane does the same exchanges
// in every block, so it is back where it started.
struct lospmm_block_run {
  std::mutex mu;
  std::vector<std::unique_ptr<std::condition_variable>> wake;
  std::condition_variable block_done;
  std::vector<int> state;  // 0 runnable, 1 at the barrier, 2 done
  unsigned running = 0;
  unsigned generation = 0;
  bool quit = false;
};
static lospmm_block_run* lospmm_run;
static void lospmm_pass_turn(unsigned me, int state) {  // with the lock held
  lospmm_block_run& r = *lospmm_run;
  const unsigned n = (unsigned)r.state.size();
  r.state[me] = state;
  unsigned next = n;
  for (unsigned i = me + 1; i < n && next == n; ++i) if (r.state[i] == 0) next = i;
  if (next == n) {  // everyone is at the barrier or done: it opens
    for (unsigned i = 0; i < n; ++i) if (r.state[i] == 1) r.state[i] = 0;
    for (unsigned i = 0; i < n && next == n; ++i) if (r.state[i] == 0) next = i;
  }
  r.running = next;
  if (next < n) r.wake[next]->notify_one();
  else r.block_done.notify_one();  // every thread is done with the block
}
static void lospmm_wait_turn(std::unique_lock<std::mutex>& lock, unsigned me) {
  lospmm_run->wake[me]->wait(lock, [me] { return lospmm_run->running == me; });
}
void lospmm_syncthreads() {
  const unsigned me = threadIdx.x;
  std::unique_lock<std::mutex> lock(lospmm_run->mu);
  lospmm_pass_turn(me, 1);
  lospmm_wait_turn(lock, me);
}
#else
void lospmm_syncthreads() { fprintf(stderr, "__syncthreads in a kernel not run as a cooperative block\n"); exit(26); }
#endif
template <class T> static T* read_array(FILE* f, long long* count) {
  if (fread(count, sizeof(long long), 1, f) != 1) { fprintf(stderr, "short input\n"); exit(3); }
  T* p = static_cast<T*>(malloc(sizeof(T) * (*count > 0 ? *count : 1)));
  if (*count > 0 && fread(p, sizeof(T), *count, f) != (size_t)*count) { fprintf(stderr, "short input\n"); exit(3); }
  return p;
}
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = fopen(argv[1], "rb");
  if (!in) return 2;
  unsigned dims[4];
  if (fread(dims, sizeof(unsigned), 4, in) != 4) return 3;
@READ@
  fclose(in);
  gridDim = {dims[0], dims[1], 1};
  blockDim = {dims[2], 1, 1};
  if (dims[3]) lospmm_dynamic_shared = malloc(dims[3]);  // dims[3]: the launch's dynamic shared bytes
#ifdef LOSPMM_COOPERATIVE
  lospmm_block_run run;
  lospmm_run = &run;
  run.state.assign(dims[2], 2);
  run.running = dims[2];
  for (unsigned tx = 0; tx < dims[2]; ++tx) run.wake.emplace_back(new std::condition_variable);
  std::vector<std::thread> threads;
  for (unsigned tx = 0; tx < dims[2]; ++tx)
    threads.emplace_back([&, tx] {
      threadIdx = {tx, 0, 0};
      for (unsigned generation = 1;; ++generation) {
        std::unique_lock<std::mutex> lock(run.mu);
        run.wake[tx]->wait(lock, [&] { return run.quit || (run.generation == generation && run.running == tx); });
        if (run.quit) return;
        lock.unlock();
        @KERNEL@(@ARGS@);
        lock.lock();
        lospmm_pass_turn(tx, 2);
      }
    });
#endif
  for (unsigned by = 0; by < dims[1]; ++by)
    for (unsigned bx = 0; bx < dims[0]; ++bx) {
      blockIdx = {bx, by, 0};
      if (dims[3]) memset(lospmm_dynamic_shared, 0xff, dims[3]);  // NaN: what a block never wrote is not zero
#ifdef LOSPMM_COOPERATIVE
      std::unique_lock<std::mutex> lock(run.mu);
      run.state.assign(dims[2], 0);
      run.running = 0;
      ++run.generation;
      run.wake[0]->notify_one();
      run.block_done.wait(lock, [&] { return run.running == dims[2]; });
#else
      for (unsigned tx = 0; tx < dims[2]; ++tx) {
        threadIdx = {tx, 0, 0};
        @KERNEL@(@ARGS@);
      }
#endif
    }
#ifdef LOSPMM_COOPERATIVE
  {
    std::unique_lock<std::mutex> lock(run.mu);
    run.quit = true;
    for (auto& w : run.wake) w->notify_one();
  }
  for (auto& t : threads) t.join();
#endif
  FILE* out = fopen(argv[2], "wb");
  if (!out) return 2;
@WRITE@
  fclose(out);
  free(lospmm_dynamic_shared);
  return 0;
}


#include <cstdio>
#include <cstdlib>
#include <cmath>
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
  for (unsigned by = 0; by < dims[1]; ++by)
    for (unsigned bx = 0; bx < dims[0]; ++bx) {
      blockIdx = {bx, by, 0};
      for (unsigned tx = 0; tx < dims[2]; ++tx) {
        threadIdx = {tx, 0, 0};
        @KERNEL@(@ARGS@);
      }
    }
  FILE* out = fopen(argv[2], "wb");
  if (!out) return 2;
@WRITE@
  fclose(out);
  return 0;
}

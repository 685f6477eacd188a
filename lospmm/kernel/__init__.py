"""The kernel model: every kernel lospmm emits is described, rendered, checked, packaged and timed here.

A kernel computes C = A·B for one pruned layer, A (M×K, sparse) baked into it, B the activations.
What it is, is one frozen description, `KernelSpec` (spec.py), the only reader and writer of
kernel.json. Everything that depends on a kernel's kind asks it:

    form         gemm (C = A·B, B K×N and C M×N row-major), conv (Y = conv(X) on NCHW X without im2col),
                 or proxy (a search proxy of one tile height M1, §5.1)
    design       how it walks its tiles (design.py): tile-x or column-x grid, column walks per block,
                 1/2/4 columns per thread, based or chained B addresses, baked, streamed or N:M-compressed
                 A values (`nm`)
    number       its number format (numbers.py): fp32; fp16/bf16 with packed, fp32 or promoted sums
    epilogue     a bias per row and ReLU/GELU applied before the store (epilogue.py)
    conv         a conv kernel's geometry (geometry.py)
    nm           an N:M kernel's pattern and blocking (nm.py)
    layout       how it is launched over N (layout.py): grid, block, columns per thread, walks

and its capabilities: params (its C signature), column_multiple, element_bytes, alignment,
n1_at_launch, serves(shape), input_shape/output_shape(count), launch_count(count), module_symbols /
module_data(A) (globals a loader fills before the first launch), cooperative (blocks meet at
barriers), path_counts(count) (the counts a check runs so that every path runs). Which ways a
layer can be served, each priced, is choices.py's.

The kernels the system emits, with the renderer of each (render/: one entry point, `kernel_source`
for a layer's kernel and `proxy_source` for a proxy; the number format is the strategy every
renderer uses, render/numbers.py; the C++ they include is in include/):

    baked GEMM       render/baked.py     Alg. 2: each A tile a __noinline__ straight-line function of
                                         literal multiply-adds, B values prefetched, tiles sharded into
                                         units compiled apart and linked (fp32 in every design; fp16/bf16
                                         in the baseline grid with based or chained loads); its proxy
    staged GEMM      render/staged.py    a block of G tiles copies the union of their columns of B into
                                         shared memory a chunk of K at a time, each tile's warps read it
                                         there (fp32); with a conv geometry, the copy gathers the window
                                         inputs of the block's output pixels; its proxy
    streamed GEMM    render/streamed.py  A's tiles as data read by one loop: O(1) code (fp32), an epilogue's
                                         bias as data; the same loop reading NCHW X at each column's window
                                         offset for a convolution; its proxy
    N:M GEMM, conv   render/nm.py        an N:M A compressed into module data filled at load (nm.py), B
                                         through double-buffered shared memory; fp32, fp16, bf16; with a
                                         conv geometry (fp32), each stage gathers its output pixels' inputs
    N:M on sparse    render/sparse_mma.py  an A keeping at most 2 of every 4 columns as mma.sp's fragments
    tensor cores                         and metadata (sparse_mma.py), B through shared memory and
                                         ldmatrix; fp16, bf16 with fp32 sums (design nm, acc=mma)
    implicit conv    render/conv.py      Alg. 2 reading NCHW X at each window offset (fp32; grid order, walks)

One way to run and check (backend.py): a kernel on the `cuda` backend (cuda.py: the cubin through
the driver) or the `host` backend (host.py: the same text built for the CPU under a shim, every block
and thread in a loop, optionally under AddressSanitizer) has `run(x)` on numpy arrays; check.py
judges its output against the reference in its number format's metric and tolerance (fp32: relative
error within 1e-4; half: bit for bit its exact model, then the rounding bound of its row length).
The emit stage, the loader (arrays.py: torch/CuPy/numpy), lospmm.torch and the device program all go
through them. package.py is the kernel directory (kernel.cu, kernel.cubin, kernel.json,
weight.parquet and their manifest). timing.py is what a timer is (`Timer`, `LaunchUnderTest`,
`Timing`, the noise rule); estimate.py the analytic model (the `estimate` timer); cuda.py the `cuda`
timer. sass.py counts a cubin's SASS (nvdisasm).
"""

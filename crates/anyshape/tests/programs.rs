//! Every kind of program, compiled, against the reference interpreter at random
//! shapes drawn from the symbols' ranges (1, primes, one past a vector of 16 or
//! 8 lanes): element-wise math, data movement (reshape, transpose, strided
//! slice, concat, every pad mode, gather, iota, scan), reductions over leading,
//! middle and trailing axes, softmax and layer norm (stitch), windows
//! (convolutions with stride, dilation, padding and groups, pooling, transposed
//! convolution) and matmuls. Each graph runs with and without the rewrites.

mod common;

use anyshape::{CompileOptions, DType, Elems, Int8, LoadOptions, Model, Tensor};
use common::{shape_at, Lcg};
use proptest::prelude::*;

const ELEMENTWISE: &str = r#"graph {
  sym n param 1..40
  sym m param 1..40
  input %x: f32[n, m]
  input %y: f32[m]
  %y2: f32[1, m] = reshape %y
  %yb: f32[n, m] = broadcast %y2
  %a: f32[n, m] = add %x, %yb
  %e: f32[n, m] = exp %a
  %t: f32[n, m] = tanh %x
  %er: f32[n, m] = erf %x
  %sg: f32[n, m] = sigmoid %a
  %s: f32[n, m] = sqrt %e
  %l: f32[n, m] = log %e
  %mx: f32[n, m] = max %er, %t
  %mn: f32[n, m] = min %sg, %mx
  %d: f32[n, m] = div %mn, %s
  %c: bool[n, m] = less %x, %yb
  %sel: f32[n, m] = select %c, %d, %l
  %fl: f32[n, m] = floor %a
  %ab: f32[n, m] = abs %fl
  %ng: f32[n, m] = neg %ab
  %sq: f32[n, m] = mul %ng, %ng
  %r: f32[n, m] = relu %x
  %three: i64[] = constant 3
  %three2: i64[1, 1] = reshape %three
  %threeb: i64[n, m] = broadcast %three2
  %i: i64[n, m] = cast %fl
  %im: i64[n, m] = mod %i, %threeb
  %idv: i64[n, m] = div %i, %threeb
  %nt: bool[n, m] = not %c
  output %sel, %sq, %r, %im, %idv, %nt
}
"#;

const MOVEMENT: &str = r#"graph {
  sym n param 3..40
  sym m param 1..24
  input %x: f32[n, m, 4]
  input %ids: i64[m]
  %t: f32[4, n, m] = transpose[perm=[2, 0, 1]] %x
  %r: f32[4, n*m] = reshape %t
  %sl: f32[4, n*m] = slice[1: 0 step 1] %r
  %st: f32[2, n*m] = slice[0: 1 step 2] %sl
  %cat: f32[6, n*m] = concat[axis=0] %st, %r
  %p: f32[n+3, m, 4] = pad[pads=[(1, 2), (0, 0), (0, 0)], mode=constant(0.5)] %x
  %pr: f32[n+4, m, 4] = pad[pads=[(2, 2), (0, 0), (0, 0)], mode=reflect] %x
  %pe: f32[n, m+3, 4] = pad[pads=[(0, 0), (1, 2), (0, 0)], mode=edge] %x
  %w: f32[5, 3] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
  %g: f32[m, 3] = gather[axis=0] %w, %ids
  %pos: f32[m, 3] = iota[axis=0]
  %gp: f32[m, 3] = add %g, %pos
  %cs: f32[m, 3] = cumsum[axis=0, exclusive=false, reverse=false] %gp
  %cse: f32[m, 3] = cumsum[axis=0, exclusive=true, reverse=true] %gp
  %gt: f32[3, m] = transpose[perm=[1, 0]] %gp
  %csl: f32[3, m] = cumsum[axis=1, exclusive=false, reverse=true] %gt
  %csx: f32[3, m] = cumsum[axis=1, exclusive=true, reverse=false] %gt
  output %cat, %p, %pr, %pe, %cs, %cse, %csl, %csx
}
"#;

const REDUCTIONS: &str = r#"graph {
  sym n param 1..40
  sym m param 1..70
  input %x: f32[3, n, m]
  %s0: f32[n, m] = reduce_sum[axes=[0], keep_dims=false] %x
  %s1: f32[3, 1, m] = reduce_max[axes=[1], keep_dims=true] %x
  %s2: f32[3, n] = reduce_mean[axes=[2], keep_dims=false] %x
  %s12: f32[3] = reduce_min[axes=[1, 2], keep_dims=false] %x
  %h: f32[3, n, m] = mul %x, %x
  %pr: f32[3, n, 1] = reduce_prod[axes=[2], keep_dims=true] %x
  %mx: f32[3, n, 1] = reduce_max[axes=[2], keep_dims=true] %x
  %mxb: f32[3, n, m] = broadcast %mx
  %sh: f32[3, n, m] = sub %x, %mxb
  %ex: f32[3, n, m] = exp %sh
  %sm: f32[3, n, 1] = reduce_sum[axes=[2], keep_dims=true] %ex
  %smb: f32[3, n, m] = broadcast %sm
  %softmax: f32[3, n, m] = div %ex, %smb
  %mean: f32[3, n, 1] = reduce_mean[axes=[2], keep_dims=true] %x
  %meanb: f32[3, n, m] = broadcast %mean
  %dev: f32[3, n, m] = sub %x, %meanb
  %sq: f32[3, n, m] = mul %dev, %dev
  %var: f32[3, n, 1] = reduce_mean[axes=[2], keep_dims=true] %sq
  %eps: f32[] = constant 0.00001
  %eps3: f32[1, 1, 1] = reshape %eps
  %epsb: f32[3, n, 1] = broadcast %eps3
  %ve: f32[3, n, 1] = add %var, %epsb
  %rs: f32[3, n, 1] = sqrt %ve
  %inv: f32[3, n, 1] = reciprocal %rs
  %invb: f32[3, n, m] = broadcast %inv
  %ln: f32[3, n, m] = mul %dev, %invb
  output %s0, %s1, %s2, %s12, %pr, %softmax, %ln, %h
}
"#;

const WINDOWS: &str = r#"graph {
  sym h param 3..19
  sym w param 3..21
  input %img: f32[2, 4, h, w]
  %k: f32[6, 2, 3, 3] = constant @k
  %conv: f32[2, 6, (h-1)/2+1, (w-1)/2+1] = conv[strides=[2, 2], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=2] %img, %k
  %kd: f32[3, 4, 2, 2] = constant @kd
  %dil: f32[2, 3, h-2, w-2] = conv[strides=[1, 1], dilations=[2, 2], pads_begin=[0, 0], pads_end=[0, 0], group=1] %img, %kd
  %mp: f32[2, 4, h/2, w/2] = max_pool[kernel=[2, 2], strides=[2, 2], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0]] %img
  %ap: f32[2, 4, h, w] = avg_pool[kernel=[3, 3], strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], count_include_pad=false] %img
  %api: f32[2, 4, h, w] = avg_pool[kernel=[3, 3], strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], count_include_pad=true] %img
  %kt: f32[4, 3, 2, 2] = constant @kt
  %up: f32[2, 3, 2*h, 2*w] = conv_transpose[strides=[2, 2], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %img, %kt
  output %conv, %dil, %mp, %ap, %api, %up
}
"#;

const MATMULS: &str = r#"graph {
  sym b param 1..4
  sym m param 1..70
  sym k param 1..40
  input %x: f32[b, m, k]
  input %y: f32[b, k, m]
  input %ix: i64[m, 3]
  %w: f32[k, 5] = constant @w5
  %x2: f32[b*m, k] = reshape %x
  %dense: f32[b*m, 5] = matmul %x2, %w
  %bmm: f32[b, m, m] = matmul %x, %y
  %bt: f32[b, m, m] = matmul[transpose_b] %x, %x
  %at: f32[b, k, k] = matmul[transpose_a] %x, %x
  %i3: i64[3, 2] = constant [1, 2, 3, 4, 5, 6]
  %imm: i64[m, 2] = matmul %ix, %i3
  output %dense, %bmm, %bt, %at, %imm
}
"#;

const EPILOGUE: &str = r#"graph {
  sym m param 1..70
  input %x: f32[m, 8]
  input %r: f32[m, 5]
  %w: f32[8, 5] = constant [0.1, -0.2, 0.3, -0.4, 0.5, 0.6, -0.7, 0.8, -0.9, 1.0, -0.1, 0.2, -0.3, 0.4, -0.5, -0.6, 0.7, -0.8, 0.9, -1.0, 0.15, -0.25, 0.35, -0.45, 0.55, 0.65, -0.75, 0.85, -0.95, 1.05, -0.15, 0.25, -0.35, 0.45, -0.55, -0.65, 0.75, -0.85, 0.95, -1.05]
  %bias: f32[5] = constant [0.1, -0.2, 0.3, -0.4, 0.5]
  %y: f32[m, 5] = matmul %x, %w
  %b2: f32[1, 5] = reshape %bias
  %bb: f32[m, 5] = broadcast %b2
  %h: f32[1, 1] = constant [0.5]
  %hb: f32[m, 5] = broadcast %h
  %s: f32[m, 5] = mul %y, %hb
  %a: f32[m, 5] = add %s, %bb
  %z: f32[m, 5] = add %a, %r
  %o: f32[m, 5] = relu %z
  output %o
}
"#;

/// A product dequantized as a quantized model's is: its columns scaled by a
/// run-time scale times a constant per column, less a computed offset per
/// column, then a residual and an activation. The column terms are computed
/// first, by a program over the columns, and the kernel applies the rest.
const COLUMN_SCALE_EPILOGUE: &str = r#"graph {
  sym m param 1..70
  input %x: f32[m, 8]
  input %r: f32[m, 5]
  input %s: f32[1, 1]
  %w: f32[8, 5] = constant [0.1, -0.2, 0.3, -0.4, 0.5, 0.6, -0.7, 0.8, -0.9, 1.0, -0.1, 0.2, -0.3, 0.4, -0.5, -0.6, 0.7, -0.8, 0.9, -1.0, 0.15, -0.25, 0.35, -0.45, 0.55, 0.65, -0.75, 0.85, -0.95, 1.05, -0.15, 0.25, -0.35, 0.45, -0.55, -0.65, 0.75, -0.85, 0.95, -1.05]
  %cs: f32[1, 5] = constant [0.5, 1.5, -0.25, 2.0, 0.75]
  %y: f32[m, 5] = matmul %x, %w
  %sb: f32[1, 5] = broadcast %s
  %k: f32[1, 5] = mul %sb, %cs
  %kb: f32[m, 5] = broadcast %k
  %p: f32[m, 5] = mul %y, %kb
  %z: f32[1, 5] = sub %cs, %sb
  %zb: f32[m, 5] = broadcast %z
  %a: f32[m, 5] = sub %p, %zb
  %q: f32[m, 5] = add %a, %r
  %o: f32[m, 5] = tanh %q
  output %o
}
"#;

/// GPT-2's GELU, `0.5·y·(1 + tanh(√(2/π)·(y + 0.044715·y³)))` with the cube as
/// `pow(y, 3)`, after a matmul and its bias: the epilogue fuses into the kernel.
const GELU_TANH_EPILOGUE: &str = r#"graph {
  sym m param 1..70
  input %x: f32[m, 8]
  %w: f32[8, 5] = constant [0.1, -0.2, 0.3, -0.4, 0.5, 0.6, -0.7, 0.8, -0.9, 1.0, -0.1, 0.2, -0.3, 0.4, -0.5, -0.6, 0.7, -0.8, 0.9, -1.0, 0.15, -0.25, 0.35, -0.45, 0.55, 0.65, -0.75, 0.85, -0.95, 1.05, -0.15, 0.25, -0.35, 0.45, -0.55, -0.65, 0.75, -0.85, 0.95, -1.05]
  %bias: f32[5] = constant [0.1, -0.2, 0.3, -0.4, 0.5]
  %mm: f32[m, 5] = matmul %x, %w
  %b2: f32[1, 5] = reshape %bias
  %bb: f32[m, 5] = broadcast %b2
  %y: f32[m, 5] = add %mm, %bb
  %three: f32[1, 1] = constant [3.0]
  %threeb: f32[m, 5] = broadcast %three
  %cube: f32[m, 5] = pow %y, %threeb
  %k: f32[1, 1] = constant [0.044715]
  %kb: f32[m, 5] = broadcast %k
  %kc: f32[m, 5] = mul %kb, %cube
  %inner: f32[m, 5] = add %y, %kc
  %c: f32[1, 1] = constant [0.7978845608028654]
  %cb: f32[m, 5] = broadcast %c
  %u: f32[m, 5] = mul %inner, %cb
  %t: f32[m, 5] = tanh %u
  %one: f32[1, 1] = constant [1.0]
  %oneb: f32[m, 5] = broadcast %one
  %s: f32[m, 5] = add %oneb, %t
  %half: f32[1, 1] = constant [0.5]
  %halfb: f32[m, 5] = broadcast %half
  %hy: f32[m, 5] = mul %halfb, %y
  %o: f32[m, 5] = mul %hy, %s
  output %o
}
"#;

/// A convolution's shape of product, `W[5, 8] · x[b]` for every image `b`, with
/// a shortcut added and a ReLU: the batched matmul's epilogue reads the residual
/// per entry.
const BATCHED_RESIDUAL_EPILOGUE: &str = r#"graph {
  sym b param 1..4
  sym m param 1..70
  input %x: f32[b, 8, m]
  input %r: f32[b, 5, m]
  %w: f32[1, 5, 8] = constant [0.1, -0.2, 0.3, -0.4, 0.5, 0.6, -0.7, 0.8, -0.9, 1.0, -0.1, 0.2, -0.3, 0.4, -0.5, -0.6, 0.7, -0.8, 0.9, -1.0, 0.15, -0.25, 0.35, -0.45, 0.55, 0.65, -0.75, 0.85, -0.95, 1.05, -0.15, 0.25, -0.35, 0.45, -0.55, -0.65, 0.75, -0.85, 0.95, -1.05]
  %wb: f32[b, 5, 8] = broadcast %w
  %y: f32[b, 5, m] = matmul %wb, %x
  %z: f32[b, 5, m] = add %y, %r
  %o: f32[b, 5, m] = relu %z
  output %o
}
"#;

/// Broadcasts whose dims may or may not be 1 at run time (`k` is 1 or `n`, `j`
/// is 1 or `m`): the program is versioned on `j == 1`, the dim along the lanes.
const MAYBE_BROADCAST: &str = r#"graph {
  sym n param 1..40
  sym m param 1..40
  sym k param 1..40
  sym j param 1..40
  assert k broadcasts to n
  assert j broadcasts to m
  input %x: f32[n, m]
  input %y: f32[k, m]
  input %z: f32[n, j]
  %yb: f32[n, m] = broadcast %y
  %zb: f32[n, m] = broadcast %z
  %a: f32[n, m] = add %x, %yb
  %b: f32[n, m] = mul %a, %zb
  output %b
}
"#;

/// Windows over rows wide enough that most vectors lie inside the padding (a
/// plain load there, a masked one only at the borders): depthwise convolutions
/// at strides 1 and 2, a padded average pool and a constant pad; stride-2 reads
/// along the row (two loads and a shuffle, not a gather).
const WIDE_WINDOWS: &str = r#"graph {
  sym h param 1..9
  sym w param 1..80
  input %img: f32[1, 3, h, w]
  %kdw: f32[3, 1, 3, 3] = constant @kdw
  %dw: f32[1, 3, h, w] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=3] %img, %kdw
  %dw2: f32[1, 3, (h-1)/2+1, (w-1)/2+1] = conv[strides=[2, 2], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=3] %img, %kdw
  %ap: f32[1, 3, h, w] = avg_pool[kernel=[3, 3], strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], count_include_pad=false] %img
  %p: f32[1, 3, h, w+5] = pad[pads=[(0, 0), (0, 0), (0, 0), (2, 3)], mode=constant(0.5)] %img
  %ev: f32[1, 3, h, w/2] = slice[3: 0 step 2] %img
  %od: f32[1, 3, h, w/2] = slice[3: 1 step 2] %img
  %eo: f32[1, 3, h, w/2] = sub %ev, %od
  output %dw, %dw2, %ap, %p, %eo
}
"#;

/// Convolutions whose taps the contraction engine reads from a channels-last
/// image (implicit GEMM): 3×3 with padding at strides 1 and 2, a dilated one,
/// and a 1×1 at stride 2, after one another (the image between them stays
/// channels-last); 17 and 24 channels: a vector and a bit, and not a power of two.
const CONV_TAPS: &str = r#"graph {
  sym h param 1..19
  sym w param 1..21
  input %img: f32[2, 17, h, w]
  %k1: f32[24, 17, 3, 3] = constant @k1
  %c1: f32[2, 24, h, w] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=1] %img, %k1
  %r1: f32[2, 24, h, w] = relu %c1
  %k2: f32[9, 24, 3, 3] = constant @k2
  %c2: f32[2, 9, (h-1)/2+1, (w-1)/2+1] = conv[strides=[2, 2], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=1] %r1, %k2
  %k3: f32[5, 24, 1, 1] = constant @k3
  %c3: f32[2, 5, (h-1)/2+1, (w-1)/2+1] = conv[strides=[2, 2], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %r1, %k3
  %k4: f32[7, 24, 3, 2] = constant @k4
  %c4: f32[2, 7, h, w+1] = conv[strides=[1, 1], dilations=[2, 2], pads_begin=[2, 1], pads_end=[2, 2], group=1] %r1, %k4
  output %c2, %c3, %c4
}
"#;

/// Pools and reductions between convolutions, as in a ResNet: the max pool
/// and the average pool run channels-last; the reductions read the products'
/// layout through its channels-first view.
const POOLS_BETWEEN_CONVS: &str = r#"graph {
  sym h param 1..19
  sym w param 1..21
  input %img: f32[2, 17, h, w]
  %k1: f32[24, 17, 3, 3] = constant @k1
  %c1: f32[2, 24, h, w] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=1] %img, %k1
  %r1: f32[2, 24, h, w] = relu %c1
  %mp: f32[2, 24, (h-1)/2+1, (w-1)/2+1] = max_pool[kernel=[3, 3], strides=[2, 2], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1]] %r1
  %k3: f32[5, 24, 1, 1] = constant @k3
  %c3: f32[2, 5, (h-1)/2+1, (w-1)/2+1] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %mp, %k3
  %ap: f32[2, 5, (h-1)/2+1, (w-1)/2+1] = avg_pool[kernel=[3, 3], strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], count_include_pad=false] %c3
  %gap: f32[2, 5, 1, 1] = reduce_mean[axes=[2, 3], keep_dims=true] %ap
  %gmax: f32[2, 5] = reduce_max[axes=[2, 3], keep_dims=false] %c3
  %cmax: f32[2, 1, (h-1)/2+1, (w-1)/2+1] = reduce_max[axes=[1], keep_dims=true] %c3
  %csum: f32[2, (h-1)/2+1, (w-1)/2+1] = reduce_sum[axes=[1], keep_dims=false] %c3
  %wsum: f32[2, 5, (h-1)/2+1] = reduce_sum[axes=[3], keep_dims=false] %c3
  output %ap, %gap, %gmax, %cmax, %csum, %wsum
}
"#;

/// Grouped convolutions: depthwise (multiplier 1 and 2: sums of products); 3
/// groups of 3 outputs (joined into one product, block-diagonal) with
/// dilation and uneven pads; 2 groups of 16 outputs (a product per group,
/// each reading its channels' taps in place); and a depthwise one between 1×1
/// convolutions (channels-last from end to end).
const GROUPED_CONVS: &str = r#"graph {
  sym h param 1..19
  sym w param 1..21
  input %img: f32[2, 6, h, w]
  %kdw6: f32[6, 1, 3, 3] = constant @kdw6
  %dw: f32[2, 6, h, w] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=6] %img, %kdw6
  %kdm: f32[12, 1, 3, 3] = constant @kdm
  %dm: f32[2, 12, (h-1)/2+1, w/2+1] = conv[strides=[2, 2], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 2], group=6] %img, %kdm
  %kg: f32[9, 2, 3, 3] = constant @kg
  %gd: f32[2, 9, h, w] = conv[strides=[1, 1], dilations=[2, 2], pads_begin=[2, 1], pads_end=[2, 3], group=3] %img, %kg
  %kbig: f32[32, 3, 3, 3] = constant @kbig
  %big: f32[2, 32, h, w] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=2] %img, %kbig
  %ke: f32[12, 6, 1, 1] = constant @ke
  %e: f32[2, 12, h, w] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %img, %ke
  %er: f32[2, 12, h, w] = relu %e
  %kdw12: f32[12, 1, 3, 3] = constant @kdm
  %d: f32[2, 12, h, w] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=12] %er, %kdw12
  %dr: f32[2, 12, h, w] = relu %d
  %kp: f32[6, 12, 1, 1] = constant @kp
  %p: f32[2, 6, h, w] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %dr, %kp
  %block: f32[2, 6, h, w] = add %p, %img
  output %dw, %dm, %gd, %big, %block
}
"#;

/// Element-wise epilogues beyond the named activations, each after a matmul
/// and its bias: ReLU6's clip, SiLU, hard-swish and a leaky ReLU's select.
const POINTWISE_EPILOGUES: &str = r#"graph {
  sym m param 1..70
  input %x1: f32[m, 8]
  input %x2: f32[m, 8]
  input %x3: f32[m, 8]
  input %x4: f32[m, 8]
  %w: f32[8, 5] = constant [0.1, -0.2, 0.3, -0.4, 0.5, 0.6, -0.7, 0.8, -0.9, 1.0, -0.1, 0.2, -0.3, 0.4, -0.5, -0.6, 0.7, -0.8, 0.9, -1.0, 0.15, -0.25, 0.35, -0.45, 0.55, 0.65, -0.75, 0.85, -0.95, 1.05, -0.15, 0.25, -0.35, 0.45, -0.55, -0.65, 0.75, -0.85, 0.95, -1.05]
  %bias: f32[1, 5] = constant [0.1, -0.2, 0.3, -0.4, 0.5]
  %zero: f32[1, 1] = constant [0.0]
  %six: f32[1, 1] = constant [6.0]
  %three: f32[1, 1] = constant [3.0]
  %slope: f32[1, 1] = constant [0.1]
  %m1: f32[m, 5] = matmul %x1, %w
  %b1: f32[m, 5] = broadcast %bias
  %y1: f32[m, 5] = add %m1, %b1
  %z1: f32[m, 5] = broadcast %zero
  %lo: f32[m, 5] = max %y1, %z1
  %s1: f32[m, 5] = broadcast %six
  %relu6: f32[m, 5] = min %lo, %s1
  %m2: f32[m, 5] = matmul %x2, %w
  %b2: f32[m, 5] = broadcast %bias
  %y2: f32[m, 5] = add %m2, %b2
  %sg: f32[m, 5] = sigmoid %y2
  %silu: f32[m, 5] = mul %y2, %sg
  %m3: f32[m, 5] = matmul %x3, %w
  %b3: f32[m, 5] = broadcast %bias
  %y3: f32[m, 5] = add %b3, %m3
  %t3: f32[m, 5] = broadcast %three
  %y3p: f32[m, 5] = add %y3, %t3
  %z3: f32[m, 5] = broadcast %zero
  %y3l: f32[m, 5] = max %y3p, %z3
  %s3: f32[m, 5] = broadcast %six
  %y3c: f32[m, 5] = min %y3l, %s3
  %y3m: f32[m, 5] = mul %y3, %y3c
  %s3d: f32[m, 5] = broadcast %six
  %hswish: f32[m, 5] = div %y3m, %s3d
  %m4: f32[m, 5] = matmul %x4, %w
  %z4: f32[m, 5] = broadcast %zero
  %neg: bool[m, 5] = less %m4, %z4
  %sl4: f32[m, 5] = broadcast %slope
  %small: f32[m, 5] = mul %m4, %sl4
  %leaky: f32[m, 5] = select %neg, %small, %m4
  output %relu6, %silu, %hswish, %leaky
}
"#;

fn weights(name: &str) -> Option<std::sync::Arc<ir::ConstData>> {
    let shape: Vec<usize> = match name {
        "k1" => vec![24, 17, 3, 3],
        "k2" => vec![9, 24, 3, 3],
        "k3" => vec![5, 24, 1, 1],
        "k4" => vec![7, 24, 3, 2],
        "k" => vec![6, 2, 3, 3],
        "kd" => vec![3, 4, 2, 2],
        "kt" => vec![4, 3, 2, 2],
        "kdw" => vec![3, 1, 3, 3],
        "kdw6" => vec![6, 1, 3, 3],
        "kdm" => vec![12, 1, 3, 3],
        "kg" => vec![9, 2, 3, 3],
        "kbig" => vec![32, 3, 3, 3],
        "ke" => vec![12, 6, 1, 1],
        "kp" => vec![6, 12, 1, 1],
        "w1000" => vec![16, 1000],
        "w5" => return None,
        _ => return None,
    };
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i * 7919 % 23) as f32 - 11.0) / 11.0).collect();
    let t = Tensor::new(shape, Elems::F32(v)).ok()?;
    Some(std::sync::Arc::new(ir::ConstData::from_tensor(&t)))
}

/// Parse `text`, binding `@w5` to a `k × 5` weight of the fixed `k` given.
fn model(text: &str, rewrite: bool, k: Option<usize>) -> Model {
    let w = |name: &str| match (name, k) {
        ("w5", Some(k)) => {
            let v: Vec<f32> = (0..k * 5).map(|i| ((i * 31 % 17) as f32 - 8.0) / 8.0).collect();
            Some(std::sync::Arc::new(ir::ConstData::from_tensor(
                &Tensor::new(vec![k, 5], Elems::F32(v)).ok()?,
            )))
        }
        _ => weights(name),
    };
    let text = match k {
        Some(k) => text
            .replace("sym k param 1..40", &format!("sym k param {k}..{k}"))
            .replace("f32[k, 5] = constant", &format!("f32[{k}, 5] = constant")),
        None => text.to_string(),
    };
    let g = ir::parse_graph(&text, &w).unwrap_or_else(|e| panic!("{e}"));
    Model::from_ir(g, &LoadOptions::new().rewrite(rewrite)).unwrap_or_else(|e| panic!("{e}"))
}

fn inputs(m: &Model, dims: &[(&str, usize)], seed: u64) -> Vec<(String, Tensor)> {
    inputs_from(m, dims, seed, 0.0)
}

/// [`inputs`] with the floats moved up by `shift` (from [-2, 2)).
fn inputs_from(m: &Model, dims: &[(&str, usize)], seed: u64, shift: f32) -> Vec<(String, Tensor)> {
    let mut rng = Lcg::new(seed);
    m.inputs()
        .into_iter()
        .map(|info| {
            let shape = shape_at(&info.ty, dims);
            let n: usize = shape.iter().product();
            let elems = match info.ty.dtype {
                DType::I64 if info.name == "ids" => {
                    Elems::I64((0..n).map(|_| (rng.next() % 10) as i64 - 5).collect())
                }
                DType::I64 => Elems::I64((0..n).map(|_| (rng.next() % 21) as i64 - 10).collect()),
                _ => Elems::F32((0..n).map(|_| rng.unit() + shift).collect()),
            };
            (info.name, Tensor::new(shape, elems).expect("tensor"))
        })
        .collect()
}

fn compare(m: &Model, dims: &[(&str, usize)], seed: u64) -> Result<(), TestCaseError> {
    compare_from(m, dims, seed, 0.0)
}

/// [`compare`] on inputs moved up by `shift`.
fn compare_from(m: &Model, dims: &[(&str, usize)], seed: u64, shift: f32) -> Result<(), TestCaseError> {
    let cm = m
        .compile(&CompileOptions::new().threads(2).canaries(true))
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let ins = inputs_from(m, dims, seed, shift);
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let want = m.interpret(&named).map_err(|e| TestCaseError::fail(format!("{dims:?}: interpreter: {e}")))?;
    let got = cm.run(&named).map_err(|e| TestCaseError::fail(format!("{dims:?}: compiled: {e}")))?;
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        prop_assert_eq!(g.shape(), w.shape(), "{:?}: {}", dims, name);
        let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            let ok = (a - b).abs() <= 1e-4 * (1.0 + b.abs()) || (a.is_nan() && b.is_nan());
            prop_assert!(ok, "{:?}: {}[{}] = {}, the interpreter says {}", dims, name, i, a, b);
        }
    }
    Ok(())
}

/// 1, primes, one past 8 and 16 lanes, and values up to `hi`.
fn size(lo: usize, hi: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        prop::sample::select(vec![1usize, 2, 3, 5, 7, 9, 13, 16, 17, 31, 33, 40, 64, 65])
            .prop_map(move |v| v.clamp(lo, hi)),
        lo..=hi
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    #[test]
    fn elementwise_programs(n in size(1, 40), m in size(1, 40), seed in 0u64..1000, rw in any::<bool>()) {
        compare(&model(ELEMENTWISE, rw, None), &[("n", n), ("m", m)], seed)?;
    }

    #[test]
    fn movement_programs(n in size(3, 40), m in size(1, 24), seed in 0u64..1000, rw in any::<bool>()) {
        compare(&model(MOVEMENT, rw, None), &[("n", n), ("m", m)], seed)?;
    }

    #[test]
    fn reduction_and_stitch_programs(n in size(1, 40), m in size(1, 70), seed in 0u64..1000, rw in any::<bool>()) {
        compare(&model(REDUCTIONS, rw, None), &[("n", n), ("m", m)], seed)?;
    }

    #[test]
    fn versions_for_dims_that_may_be_one(n in size(1, 40), m in size(1, 40), k1 in any::<bool>(), j1 in any::<bool>(), seed in 0u64..1000, rw in any::<bool>()) {
        let model = model(MAYBE_BROADCAST, rw, None);
        let programs = anyshape::inspect::print_plan(&model.lower().map_err(|e| TestCaseError::fail(e.to_string()))?);
        prop_assert!(programs.contains("versions on: equal("), "not versioned:\n{}", programs);
        let (k, j) = (if k1 { 1 } else { n }, if j1 { 1 } else { m });
        compare(&model, &[("n", n), ("m", m), ("k", k), ("j", j)], seed)?;
    }

    #[test]
    fn wide_window_programs(h in size(1, 9), w in size(1, 80), seed in 0u64..1000, rw in any::<bool>()) {
        compare(&model(WIDE_WINDOWS, rw, None), &[("h", h), ("w", w)], seed)?;
    }

    #[test]
    fn window_programs(h in size(3, 19), w in size(3, 21), seed in 0u64..1000, rw in any::<bool>()) {
        compare(&model(WINDOWS, rw, None), &[("h", h), ("w", w)], seed)?;
    }

    #[test]
    fn convolutions_as_implicit_gemm(h in size(1, 19), w in size(1, 21), seed in 0u64..1000) {
        let model = model(CONV_TAPS, true, None);
        let plan = anyshape::inspect::print_plan(&model.lower().map_err(|e| TestCaseError::fail(e.to_string()))?);
        let taps = plan.lines().filter(|l| l.contains("matmul") && l.contains("A taps")).count();
        prop_assert_eq!(taps, 4, "the taps are not read in place:\n{}", plan);
        prop_assert!(!plan.contains(".col\""), "a column matrix is stored:\n{}", plan);
        compare(&model, &[("h", h), ("w", w)], seed)?;
    }

    #[test]
    fn pools_run_channels_last(h in size(1, 19), w in size(1, 21), seed in 0u64..1000) {
        let (rewritten, written) = (model(POOLS_BETWEEN_CONVS, true, None), model(POOLS_BETWEEN_CONVS, false, None));
        let ir = rewritten.ir_text_rewritten();
        let live = |what: &str| ir.lines().filter(|l| l.contains(what)).count();
        prop_assert_eq!(live("channels_last=true"), 2, "{}", ir);
        // The pools' layout is the products': no loop program transposes a product.
        let plan = anyshape::inspect::print_plan(&rewritten.lower().map_err(|e| TestCaseError::fail(e.to_string()))?);
        let windows = plan.lines().filter(|l| l.starts_with("group") && l.ends_with("window")).count();
        prop_assert_eq!(windows, 2, "{}", plan);
        compare(&rewritten, &[("h", h), ("w", w)], seed)?;
        // And the rewrite keeps the model's values: the compiled model against
        // the interpreter on the graph as written.
        let dims = [("h", h), ("w", w)];
        let cm = rewritten.compile(&CompileOptions::new().threads(2)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let ins = inputs(&rewritten, &dims, seed);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let want = written.interpret(&named).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let got = cm.run(&named).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            prop_assert_eq!(g.shape(), w.shape(), "{}", name);
            for (a, b) in g.to_f64_vec().iter().zip(&w.to_f64_vec()) {
                prop_assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{:?}: {} {} against {}", dims, name, a, b);
            }
        }
    }

    #[test]
    fn grouped_and_depthwise_convolutions(h in size(1, 19), w in size(1, 21), seed in 0u64..1000) {
        let model = model(GROUPED_CONVS, true, None);
        let convs = model.graph().nodes.iter().filter(|n| matches!(n.op, ir::Op::Conv(_))).count();
        prop_assert_eq!(convs, 0, "a convolution is left as a loop nest");
        let plan = anyshape::inspect::print_plan(&model.lower().map_err(|e| TestCaseError::fail(e.to_string()))?);
        let steps: Vec<&str> =
            plan.lines().filter(|l| l.starts_with("  matmul") || l.starts_with("  loop")).collect();
        // The grouped ones read their taps in place: the joined groups' weight is
        // one constant B, packed once; the two groups' are a batch of two.
        let taps: Vec<&&str> = steps.iter().filter(|l| l.contains("A taps")).collect();
        prop_assert_eq!(taps.len(), 2, "{}", plan);
        prop_assert_eq!(taps.iter().filter(|l| l.contains("(weight)")).count(), 1, "{}", plan);
        // The depthwise convolution between the 1×1 ones is one loop that reads
        // the first one's output and writes the second one's A, channels-last:
        // no transposes between them.
        let mm: Vec<usize> = (0..steps.len())
            .filter(|i| steps[*i].starts_with("  matmul") && !steps[*i].contains("A taps"))
            .collect();
        prop_assert_eq!(mm.len(), 2, "{}", plan);
        prop_assert_eq!(mm[1] - mm[0], 2, "{}", plan);
        compare(&model, &[("h", h), ("w", w)], seed)?;
    }

    #[test]
    fn matmul_with_pointwise_epilogues(m in size(1, 70), seed in 0u64..1000) {
        let model = model(POINTWISE_EPILOGUES, true, None);
        let plan = anyshape::inspect::print_plan(&model.lower().map_err(|e| TestCaseError::fail(e.to_string()))?);
        for want in [
            // The programs' constants are parameters of their kernels.
            "+ min(max(x, p0), p1) with 0.0, 6.0",
            "+ mul(x, sigmoid(x))",
            "+ div(mul(x, min(max(add(x, p0), p1), p2)), p2) with 3.0, 0.0, 6.0",
            "epilogue select(less(x, p0), mul(x, p1), x) with 0.0, 0.1",
        ] {
            prop_assert!(plan.contains(want), "{} not fused:\n{}", want, plan);
        }
        prop_assert!(!plan.contains("loop p"), "a step after a matmul:\n{}", plan);
        compare(&model, &[("m", m)], seed)?;
    }

    #[test]
    fn matmul_with_fused_epilogue(m in size(1, 70), seed in 0u64..1000) {
        let model = model(EPILOGUE, true, None);
        let plan = anyshape::inspect::print_plan(&model.lower().map_err(|e| TestCaseError::fail(e.to_string()))?);
        prop_assert!(plan.contains("epilogue scale 0.5 + bias b"), "not fused:\n{}", plan);
        prop_assert!(plan.contains(" + residual b") && plan.contains(" + relu"), "not fused:\n{}", plan);
        compare(&model, &[("m", m)], seed)?;
    }

    #[test]
    fn matmul_with_computed_column_scales(m in size(1, 70), seed in 0u64..1000) {
        let model = model(COLUMN_SCALE_EPILOGUE, true, None);
        let plan = anyshape::inspect::print_plan(&model.lower().map_err(|e| TestCaseError::fail(e.to_string()))?);
        prop_assert!(
            plan.contains("epilogue column scale b") && plan.contains(" + bias b") && plan.contains(" + residual b") && plan.contains(" + tanh"),
            "not fused:\n{}", plan
        );
        // The column terms' program runs before the product; nothing after it.
        let steps: Vec<&str> = plan.lines().filter(|l| l.starts_with("  loop") || l.starts_with("  matmul")).collect();
        prop_assert!(steps.last().is_some_and(|l| l.starts_with("  matmul")), "a step after the matmul:\n{}", plan);
        compare(&model, &[("m", m)], seed)?;
    }

    #[test]
    fn matmul_with_fused_gelu_tanh(m in size(1, 70), seed in 0u64..1000) {
        let model = model(GELU_TANH_EPILOGUE, true, None);
        let plan = anyshape::inspect::print_plan(&model.lower().map_err(|e| TestCaseError::fail(e.to_string()))?);
        prop_assert!(plan.contains("epilogue bias b") && plan.contains(" + gelutanh"), "not fused:\n{}", plan);
        compare(&model, &[("m", m)], seed)?;
    }

    #[test]
    fn batched_matmul_with_fused_residual(b in 1usize..=4, m in size(1, 70), seed in 0u64..1000) {
        let model = model(BATCHED_RESIDUAL_EPILOGUE, true, None);
        let plan = anyshape::inspect::print_plan(&model.lower().map_err(|e| TestCaseError::fail(e.to_string()))?);
        prop_assert!(plan.contains("matmul [d") && plan.contains("epilogue residual b") && plan.contains(" + relu"), "not fused:\n{}", plan);
        compare(&model, &[("b", b), ("m", m)], seed)?;
    }

    #[test]
    fn matmul_steps(b in 1usize..=4, m in size(1, 70), k in size(1, 40), seed in 0u64..1000, rw in any::<bool>()) {
        compare(&model(MATMULS, rw, Some(k)), &[("b", b), ("m", m), ("k", k)], seed)?;
    }
}

/// A value read at an outer position (the same for every lane) under a guard
/// that differs along the lanes: each half of a concatenation along the vector
/// axis (rotary embeddings' `cat(pos·freq, pos·freq)`, as Llama's exports have
/// it) is a masked read of one address.
const OUTER_READ_UNDER_LANE_GUARD: &str = r#"graph {
  sym n param 1..
  sym m param 1..
  input %pos: f32[n]
  input %freq: f32[m]
  %p2: f32[n, 1] = reshape %pos
  %pb: f32[n, m] = broadcast %p2
  %f2: f32[1, m] = reshape %freq
  %fb: f32[n, m] = broadcast %f2
  %x: f32[n, m] = mul %pb, %fb
  %c: f32[n, 2*m] = concat[axis=1] %x, %x
  %o: f32[n, 2*m] = cos %c
  output %o
}
"#;

#[test]
fn an_outer_read_under_a_guard_along_the_lanes() {
    let model = model(OUTER_READ_UNDER_LANE_GUARD, false, None);
    for (n, m) in [(1, 1), (3, 4), (2, 13), (5, 17)] {
        compare(&model, &[("n", n), ("m", m)], (n * 100 + m) as u64).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Bytes read across the lanes (a u8 and an i8 tensor transposed, one of them
/// padded so that its reads are guarded) are gathered as the aligned words
/// that hold them: every byte of a word, the sign of an i8, the pad's lanes
/// masked, against the interpreter at 1, primes and one past 16 lanes (the
/// rows' lengths put every byte of a word at lane 0 in turn).
#[test]
fn bytes_gathered_across_the_lanes() {
    let text = r#"graph {
  sym n param 1..
  sym m param 1..
  input %a: u8[n, m]
  input %b: i8[n, m]
  %at: u8[m, n] = transpose[perm=[1, 0]] %a
  %bt: i8[m, n] = transpose[perm=[1, 0]] %b
  %ap: u8[m, n+3] = pad[pads=[(0, 0), (1, 2)], mode=constant(7.0)] %at
  %af: f32[m, n] = cast %at
  %bf: f32[m, n] = cast %bt
  %s: f32[m, n] = add %af, %bf
  output %s, %ap, %bt
}
"#;
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    let m = Model::from_ir(g, &LoadOptions::new()).unwrap_or_else(|e| panic!("{e}"));
    let cm = m.compile(&CompileOptions::new().threads(2).canaries(true)).expect("compiles");
    let mut rng = Lcg::new(5);
    for (n, cols) in [(1usize, 1usize), (2, 3), (5, 17), (17, 5), (33, 7), (16, 16), (13, 31)] {
        let a: Vec<u8> = (0..n * cols).map(|_| rng.next() as u8).collect();
        let b: Vec<i8> = (0..n * cols).map(|_| rng.next() as i8).collect();
        let ins = [
            ("a", Tensor::new(vec![n, cols], Elems::U8(a)).expect("a")),
            ("b", Tensor::new(vec![n, cols], Elems::I8(b)).expect("b")),
        ];
        let got = cm.run(&ins).expect("runs");
        let want = m.interpret(&ins).expect("interprets");
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            assert_eq!(g.shape(), w.shape(), "{name} at n {n} m {cols}");
            assert_eq!(g.to_f64_vec(), w.to_f64_vec(), "{name} at n {n} m {cols}");
        }
    }
}

/// A few channels written channels-last from channels-first planes (an RGB
/// image for a convolution, padded or with a fourth channel of its zero point
/// as a quantized stem's): the lanes run along the image's rows, each vector
/// computes the channels in turn and stores them interleaved
/// (`plan::Interleave`), for 2, 3, 4, 5 and 8 channels of bytes and floats,
/// against the interpreter at widths of 1, primes and one past 16 lanes (a
/// row's tail masked, or a point at a time under 4 points).
#[test]
fn a_few_channels_written_channels_last_are_interleaved() {
    let text = r#"graph {
  sym n param 1..
  sym h param 1..
  sym w param 1..
  input %a: u8[n, 3, h, w]
  input %f: f32[n, 5, h, w]
  input %g: f32[n, 2, h, w]
  input %e: f32[n, 8, h, w]
  %at: u8[n, h, w, 3] = transpose[perm=[0, 2, 3, 1]] %a
  %ap: u8[n, h+3, w+4, 4] = pad[pads=[(0, 0), (1, 2), (3, 1), (0, 1)], mode=constant(125.0)] %at
  %ft: f32[n, h, w, 5] = transpose[perm=[0, 2, 3, 1]] %f
  %gt: f32[n, h, w, 2] = transpose[perm=[0, 2, 3, 1]] %g
  %gs: f32[n, h, w, 2] = mul %gt, %gt
  %et: f32[n, h, w, 8] = transpose[perm=[0, 2, 3, 1]] %e
  %eb: bool[n, h, w, 8] = less %et, %et
  output %ap, %ft, %gs, %et, %eb
}
"#;
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    let m = Model::from_ir(g, &LoadOptions::new()).unwrap_or_else(|e| panic!("{e}"));
    let plan = anyshape::inspect::print_plan(&m.lower().expect("lowers"));
    for c in [4, 5, 2, 8] {
        let line = format!("interleaved: lanes along i2, the {c} values of i3 computed in turn");
        assert!(plan.contains(&line), "no {c}-channel program is interleaved:\n{plan}");
    }
    let cm = m.compile(&CompileOptions::new().threads(2).canaries(true)).expect("compiles");
    let mut rng = Lcg::new(11);
    for (n, h, w) in
        [(1usize, 1usize, 1usize), (1, 2, 3), (2, 3, 16), (1, 5, 17), (2, 2, 31), (1, 3, 33), (3, 1, 19)]
    {
        let floats = |c: usize, rng: &mut Lcg| {
            let v: Vec<f32> = (0..n * c * h * w).map(|_| rng.unit()).collect();
            Tensor::new(vec![n, c, h, w], Elems::F32(v)).expect("floats")
        };
        let a: Vec<u8> = (0..n * 3 * h * w).map(|_| rng.next() as u8).collect();
        let ins = [
            ("a", Tensor::new(vec![n, 3, h, w], Elems::U8(a)).expect("a")),
            ("f", floats(5, &mut rng)),
            ("g", floats(2, &mut rng)),
            ("e", floats(8, &mut rng)),
        ];
        let got = cm.run(&ins).expect("runs");
        let want = m.interpret(&ins).expect("interprets");
        for ((name, g), (_, w_)) in got.iter().zip(&want) {
            assert_eq!(g.shape(), w_.shape(), "{name} at {n}x{h}x{w}");
            assert_eq!(g.to_f64_vec(), w_.to_f64_vec(), "{name} at {n}x{h}x{w}");
        }
    }
}

/// A channels-last sum written channels-first (ResNet's last block, its NCHW
/// output): its loads run along the channels and gather across the image's
/// width, so a row runs along the channels and each vector's values are
/// stored one plane apart (`plan::Scatter`, named in the plan); a lone
/// transposition (one load for its one store) keeps its lanes along the
/// width. Against the interpreter at channels and widths of 1, primes and one
/// past 16 lanes (a row's tail masked, or a point at a time), and past the
/// four vectors of lanes a scattered nest takes over its rows at a time,
/// bytes and floats.
#[test]
fn a_channels_last_sum_written_channels_first_is_scattered() {
    let text = r#"graph {
  sym n param 1..
  sym c param 1..
  sym h param 1..
  sym w param 1..
  input %a: u8[n, h, w, c]
  input %b: f32[n, h, w, c]
  input %t: f32[n, h, w, c]
  %af: f32[n, h, w, c] = cast %a
  %s: f32[n, h, w, c] = add %af, %b
  %r: f32[n, h, w, c] = relu %s
  %o: f32[n, c, h, w] = transpose[perm=[0, 3, 1, 2]] %r
  %tt: f32[n, c, h, w] = transpose[perm=[0, 3, 1, 2]] %t
  output %o, %tt
}
"#;
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    let m = Model::from_ir(g, &LoadOptions::new()).unwrap_or_else(|e| panic!("{e}"));
    let plan = anyshape::inspect::print_plan(&m.lower().expect("lowers"));
    let scattered = plan.matches("scattered: lanes along").count();
    assert_eq!(scattered, 1, "the sum, not the lone transposition, is scattered:\n{plan}");
    let cm = m.compile(&CompileOptions::new().threads(2).canaries(true)).expect("compiles");
    let mut rng = Lcg::new(17);
    for (n, c, h, w) in [
        (1usize, 1usize, 1usize, 1usize),
        (1, 3, 2, 5),
        (2, 16, 3, 7),
        (1, 17, 2, 2),
        (2, 33, 1, 3),
        (3, 20, 2, 1),
        (1, 5, 7, 7),
        // Lanes taken 64 at a time over the rows: one chunk, one past it, a
        // chunk's tail past two.
        (2, 64, 2, 3),
        (1, 65, 3, 2),
        (2, 131, 2, 2),
    ] {
        let len = n * h * w * c;
        let a: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let floats = |rng: &mut Lcg| Elems::F32((0..len).map(|_| rng.unit() * 100.0).collect());
        let ins = [
            ("a", Tensor::new(vec![n, h, w, c], Elems::U8(a)).expect("a")),
            ("b", Tensor::new(vec![n, h, w, c], floats(&mut rng)).expect("b")),
            ("t", Tensor::new(vec![n, h, w, c], floats(&mut rng)).expect("t")),
        ];
        let got = cm.run(&ins).expect("runs");
        let want = m.interpret(&ins).expect("interprets");
        for ((name, g), (_, w_)) in got.iter().zip(&want) {
            assert_eq!(g.shape(), w_.shape(), "{name} at {n}x{c}x{h}x{w}");
            assert_eq!(g.to_f64_vec(), w_.to_f64_vec(), "{name} at {n}x{c}x{h}x{w}");
        }
    }
}

/// A dim declared to broadcast must be 1 or the dim it stretches to: any other
/// value is rejected before a kernel runs, naming the rule.
#[test]
fn a_broadcast_dim_that_is_neither_one_nor_equal_is_an_error() {
    let model = model(MAYBE_BROADCAST, false, None);
    let cm = model.compile(&CompileOptions::new().threads(2)).expect("compiles");
    let ins = inputs(&model, &[("n", 5), ("m", 7), ("k", 2), ("j", 7)], 1);
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let e = cm.run(&named).expect_err("k = 2 is neither 1 nor n = 5").to_string();
    assert!(e.contains("k broadcasts to n") && e.contains("k = 2"), "{e}");
}

/// Reductions along long and short rows (the two row schedules: one point at a
/// time with the reduction along the lanes, or points across the lanes), along
/// the leading axis, and one-loop nests big enough for both threads (which then
/// split the loop's range, not rows), at extents around the vector width and
/// the threads' split.
const LONG_ROWS: &str = r#"graph {
  sym n param 1..
  sym m param 1..
  input %x: f32[n, m]
  input %v: f32[m]
  %s: f32[n] = reduce_sum[axes=[1], keep_dims=false] %x
  %mx: f32[n, 1] = reduce_max[axes=[1], keep_dims=true] %x
  %mean: f32[n] = reduce_mean[axes=[1], keep_dims=false] %x
  %c: f32[m] = reduce_sum[axes=[0], keep_dims=false] %x
  %e: f32[m] = exp %v
  %ec: f32[m] = mul %e, %c
  %all: f32[] = reduce_max[axes=[0, 1], keep_dims=false] %x
  %vs: f32[] = reduce_sum[axes=[0], keep_dims=false] %v
  %vm: f32[] = div %vs, %all
  output %s, %mx, %mean, %ec, %vm
}
"#;

#[test]
fn long_rows_short_rows_and_one_loop_nests_on_two_threads() {
    let m = model(LONG_ROWS, false, None);
    let plan = anyshape::inspect::print_plan(&m.lower().expect("lowers"));
    assert!(plan.contains("row reduction along"), "no row schedule:\n{plan}");
    assert!(plan.contains("reduction splits over threads"), "no split reduction:\n{plan}");
    for (i, (n, len)) in [
        (1, 100_003),
        (3, 40_000),
        (2, 15),
        (2, 16),
        (37, 1000),
        (70_001, 3),
        (40_000, 1),
        (1, 1),
        (17, 65_537),
    ]
    .into_iter()
    .enumerate()
    {
        // Inputs in [-1, 3): a row sum of 10^5 values in [-2, 2) cancels to near
        // zero, where only the terms' own f32 rounding is left to compare.
        compare_from(&m, &[("n", n), ("m", len)], i as u64, 1.0)
            .unwrap_or_else(|e| panic!("n={n} m={len}: {e}"));
    }
}

/// f64 → f16 rounds once (through f32 rounded to odd): values just past an f16
/// tie, exact ties, subnormals, overflow and NaN convert as the interpreter's
/// correctly rounded encoder does, on the vector path and the scalar tail.
#[test]
fn f64_to_f16_rounds_once() {
    let text = r#"graph {
  sym n param 1..64
  input %x: f64[n]
  %h: f16[n] = cast %x
  output %h
}
"#;
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    let m = Model::from_ir(g, &LoadOptions::new()).expect("model");
    let cm = m.compile(&CompileOptions::new().threads(1).canaries(true)).expect("compile");
    let p = |e: i32| 2f64.powi(e);
    let mut xs = vec![
        1.0 + p(-11),          // a tie: to even (1.0)
        1.0 + p(-11) + p(-40), // just past it: up (a double rounding through f32 gives 1.0)
        1.0 + 3.0 * p(-11),    // a tie: to even (up)
        -(1.0 + p(-11) + p(-40)),
        p(-25),          // half the smallest subnormal: to 0
        p(-25) + p(-60), // just past: the smallest subnormal
        65519.99,
        65520.0, // overflow: inf
        f64::NAN,
        -0.0,
        1e-300,
        0.1,
        std::f64::consts::PI,
    ];
    // Many near-ties of varied exponents.
    for e in -20..16 {
        for k in [1.0, 3.0, 5.0] {
            let tie = (1.0 + k * p(-11)) * p(e);
            xs.extend([tie, tie + tie * p(-45), tie - tie * p(-45)]);
        }
    }
    for chunk in xs.chunks(37) {
        let x = Tensor::new(vec![chunk.len()], Elems::F64(chunk.to_vec())).expect("x");
        let want = m.interpret(&[("x", x.clone())]).expect("interpreter");
        let got = cm.run(&[("x", x)]).expect("compiled");
        let (Elems::F16(w), Elems::F16(g)) = (want[0].1.elems(), got[0].1.elems()) else {
            panic!("f16 outputs")
        };
        for ((a, b), x) in g.iter().zip(w).zip(chunk) {
            let both_nan = ir::f16_to_f32(*a).is_nan() && ir::f16_to_f32(*b).is_nan();
            assert!(a == b || both_nan, "{x:e}: compiled {a:#06x}, interpreter {b:#06x}");
        }
    }
}

const MAX_MIN_NAN: &str = r#"graph {
  sym n param 1..
  sym m param 1..
  input %x: f32[n, m]
  input %y: f32[n, m]
  %rmax: f32[n] = reduce_max[axes=[1], keep_dims=false] %x
  %rmin: f32[n] = reduce_min[axes=[1], keep_dims=false] %x
  %cmax: f32[m] = reduce_max[axes=[0], keep_dims=false] %x
  %cmin: f32[m] = reduce_min[axes=[0], keep_dims=false] %x
  %emax: f32[n, m] = max %x, %y
  %emin: f32[n, m] = min %x, %y
  output %rmax, %rmin, %cmax, %cmin, %emax, %emin
}
"#;

/// Max and min, reduced along rows (vectors with a horizontal step and a scalar
/// tail) and columns, and element by element, give what the interpreter gives
/// when the data has NaNs (at the start, middle and end of rows, in the vector
/// body and the tail), infinities and zeros of both signs: a NaN anywhere in a
/// reduction, or on either side of an element-wise max, is the result. On an
/// AVX-512 host the AVX2 code is checked too.
#[test]
fn max_and_min_take_nans_infinities_and_signed_zeros_as_the_interpreter_does() {
    let model = model(MAX_MIN_NAN, false, None);
    let host = kernels::Target::detect();
    let mut isas = vec![anyshape::Isa::Host];
    if host.isa.avx512f && host.avx2_only().is_some() {
        isas.push(anyshape::Isa::Avx2);
    }
    let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, f32::MAX, -f32::MAX];
    for isa in isas {
        let cm = model.compile(&CompileOptions::new().threads(2).canaries(true).isa(isa)).expect("compiles");
        for (n, m) in [(1, 1), (3, 7), (5, 16), (4, 17), (6, 33), (2, 67), (9, 130)] {
            let mut rng = Lcg::new((n * 1000 + m) as u64);
            let mut data = |nan_rows: bool| -> Vec<f32> {
                let mut v: Vec<f32> = (0..n * m).map(|_| rng.unit()).collect();
                for x in v.iter_mut() {
                    if rng.next().is_multiple_of(7) {
                        *x = specials[rng.next() as usize % specials.len()];
                    }
                }
                if nan_rows {
                    // One NaN per row, at its start, end or middle, in turn.
                    for r in 0..n {
                        let at = [0, m - 1, m / 2][r % 3];
                        v[r * m + at] = f32::NAN;
                    }
                    // A row with no NaN, and one of zeros of both signs only.
                    if n > 3 {
                        for c in 0..m {
                            v[3 * m + c] = if c % 2 == 0 { -0.0 } else { 0.0 };
                        }
                    }
                }
                v
            };
            let x = Tensor::new(vec![n, m], Elems::F32(data(true))).expect("x");
            let y = Tensor::new(vec![n, m], Elems::F32(data(false))).expect("y");
            let named = [("x", x), ("y", y)];
            let want = model.interpret(&named).expect("interpreter");
            let got = cm.run(&named).expect("compiled");
            assert_eq!((got.len(), want.len()), (6, 6));
            for ((name, g), (_, w)) in got.iter().zip(&want) {
                let (Elems::F32(g), Elems::F32(w)) = (g.elems(), w.elems()) else {
                    panic!("{name}: not f32")
                };
                assert_eq!(g.len(), w.len(), "{name}");
                for (i, (a, b)) in g.iter().zip(w).enumerate() {
                    assert!(
                        a == b || (a.is_nan() && b.is_nan()),
                        "{isa:?} {n}x{m}: {name}[{i}] = {a}, the interpreter says {b}"
                    );
                }
            }
        }
    }
}

/// A softmax over a global average pool's means (SqueezeNet's head): the
/// stitch recomputes each mean inside the max and the sum. With means near
/// 1e10 (an ulp is 1024) every copy must add in the same order, or a point's
/// mean exceeds the max by ulps and its exponential overflows or vanishes.
/// Every channel has the same pixels, so each output is exactly 1/c.
const POOLED_SOFTMAX: &str = r#"graph {
  sym c param 1..
  sym h param 1..
  input %x: f32[c, h, h]
  %mean: f32[c, 1, 1] = reduce_mean[axes=[1, 2], keep_dims=true] %x
  %mx: f32[1, 1, 1] = reduce_max[axes=[0], keep_dims=true] %mean
  %mxb: f32[c, 1, 1] = broadcast %mx
  %sh: f32[c, 1, 1] = sub %mean, %mxb
  %ex: f32[c, 1, 1] = exp %sh
  %sm: f32[1, 1, 1] = reduce_sum[axes=[0], keep_dims=true] %ex
  %smb: f32[c, 1, 1] = broadcast %sm
  %p: f32[c, 1, 1] = div %ex, %smb
  output %p
}
"#;

#[test]
fn a_softmax_of_recomputed_means_sums_each_mean_in_one_order() {
    let m = model(POOLED_SOFTMAX, true, None);
    for isa in [anyshape::Isa::Host, anyshape::Isa::Avx2] {
        let cm = m.compile(&CompileOptions::new().threads(2).isa(isa)).expect("compiles");
        for (c, h) in [(1000, 13), (1, 1), (7, 3), (17, 9), (33, 17), (9, 16), (64, 8)] {
            let pixels: Vec<f32> = (0..h * h).map(|i| 2.0e9 + (i * 7919 % 1000) as f32 * 3.3e6).collect();
            let x: Vec<f32> = (0..c).flat_map(|_| pixels.iter().copied()).collect();
            let x = Tensor::new(vec![c, h, h], Elems::F32(x)).expect("tensor");
            let got = cm.run(&[("x", x)]).expect("runs");
            let want = 1.0 / c as f64;
            for (i, v) in got[0].1.to_f64_vec().iter().enumerate() {
                assert!((v - want).abs() <= 1e-6 * want, "{isa:?} c={c} h={h}: p[{i}] = {v}, not {want}");
            }
        }
    }
}

/// Outputs of a megabyte or more (a decoder step's whole KV cache) are faulted
/// in before the steps run: their values are the interpreter's, at sizes below
/// and above that and not a whole number of pages, call after call.
#[test]
fn large_outputs_are_faulted_in_and_whole() {
    let model = model(
        r#"graph {
  sym past param 0..100000
  sym n param 1..8
  input %past: f32[past, 64]
  input %new: f32[n, 64]
  %k: f32[past+n, 64] = concat[axis=0] %past, %new
  %v: f32[past+n, 64] = exp %k
  output %k, %v
}
"#,
        false,
        None,
    );
    let cm = model.compile(&CompileOptions::new().threads(2)).unwrap_or_else(|e| panic!("{e}"));
    for (past, n) in [(0, 1), (2000, 1), (4093, 3), (20011, 5), (2000, 1), (9, 2)] {
        let ins = inputs(&model, &[("past", past), ("n", n)], past as u64);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(s, t)| (s.as_str(), t.clone())).collect();
        let want = model.interpret(&named).unwrap_or_else(|e| panic!("{e}"));
        let got = cm.run(&named).unwrap_or_else(|e| panic!("{e}"));
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            assert_eq!(g.shape(), w.shape(), "{name} at past {past}");
            let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
            let bad = g.iter().zip(&w).position(|(a, b)| (a - b).abs() > 1e-5 * (1.0 + b.abs()));
            assert_eq!(bad, None, "{name} at past {past}, n {n}");
        }
    }
}

/// A quantized matmul, `(u8 - zero point) · i8` in i32, deep enough (K = 700:
/// 700 · 255 · 128 > 2^24) that it runs on floats in two chunks of K (512 and
/// 188 deep): compiled, it equals the exact integer sum, at the
/// extremes (every activation 255 against a column of -128, sums past 2^24) and
/// on random values, at 1, primes and one past a tile of rows.
#[test]
fn integer_contractions_run_exactly_on_floats() {
    const K: usize = 700;
    let text = format!(
        "graph {{
  sym m param 1..
  input %a: u8[m, {K}]
  input %w: i8[{K}, 5]
  input %za: u8[]
  %ai: i32[m, {K}] = cast %a
  %zi: i32[] = cast %za
  %z1: i32[1, 1] = reshape %zi
  %zb: i32[m, {K}] = broadcast %z1
  %as: i32[m, {K}] = sub %ai, %zb
  %wi: i32[{K}, 5] = cast %w
  %y: i32[m, 5] = matmul %as, %wi
  output %y
}}
"
    );
    let m = model(&text, true, None);
    let plan = anyshape::inspect::print_plan(&m.lower().expect("lowers"));
    assert!(plan.contains("matmul") && plan.contains("y.k1"), "not in chunks of K:\n{plan}");
    let cm = m.compile(&CompileOptions::new().threads(2).canaries(true)).expect("compiles");
    for (i, rows) in [1usize, 2, 7, 17, 65].into_iter().enumerate() {
        let mut rng = Lcg::new(70 + i as u64);
        let mut a: Vec<u8> = (0..rows * K).map(|_| rng.next() as u8).collect();
        let mut w: Vec<i8> = (0..K * 5).map(|_| rng.next() as i8).collect();
        a[..K].fill(255);
        for k in 0..K {
            w[k * 5] = -128;
            w[k * 5 + 1] = 127;
        }
        let za = if i % 2 == 0 { 0u8 } else { rng.next() as u8 };
        let want: Vec<i32> = (0..rows * 5)
            .map(|x| {
                let (r, c) = (x / 5, x % 5);
                let s: i64 = (0..K).map(|k| (a[r * K + k] as i64 - za as i64) * w[k * 5 + c] as i64).sum();
                s as i32
            })
            .collect();
        if za == 0 {
            assert!(want[0].unsigned_abs() > 1 << 24, "the extremes reach past 2^24: {}", want[0]);
        }
        let ins = [
            ("a", Tensor::new(vec![rows, K], Elems::U8(a)).expect("a")),
            ("w", Tensor::new(vec![K, 5], Elems::I8(w)).expect("w")),
            ("za", Tensor::new(vec![], Elems::U8(vec![za])).expect("za")),
        ];
        let got = cm.run(&ins).expect("runs");
        assert_eq!(got[0].1.elems(), &Elems::I32(want.clone()), "rows {rows}");
        assert_eq!(m.interpret(&ins).expect("interprets")[0].1.elems(), &Elems::I32(want), "rows {rows}");
    }
}

/// A quantized 3×3 convolution of 64 channels (576 deep: 576 · 255 · 128 >
/// 2^24), padded by one: on floats as the activation's base-16 digits stacked
/// along the batch, compiled, equal to the exact integer sums (the padding
/// reads the zero point: 0 after the shift, in both digits), at the extremes
/// and on random values, for 1 and 2 images of odd sizes.
#[test]
fn integer_convolutions_run_exactly_on_floats() {
    let text = "graph {
  sym n param 1..
  sym h param 1..
  input %x: u8[n, 64, h, h]
  input %k: i8[3, 64, 3, 3]
  input %zx: u8[]
  %xi: i32[n, 64, h, h] = cast %x
  %zi: i32[] = cast %zx
  %z1: i32[1, 1, 1, 1] = reshape %zi
  %zb: i32[n, 64, h, h] = broadcast %z1
  %xs: i32[n, 64, h, h] = sub %xi, %zb
  %ki: i32[3, 64, 3, 3] = cast %k
  %y: i32[n, 3, h, h] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=1] %xs, %ki
  output %y
}
";
    let m = model(text, true, None);
    let plan = anyshape::inspect::print_plan(&m.lower().expect("lowers"));
    assert!(plan.contains("y.digits"), "not as digits:\n{plan}");
    let cm = m.compile(&CompileOptions::new().threads(2).canaries(true)).expect("compiles");
    for (i, (n, h)) in [(1usize, 5usize), (2, 3), (1, 1)].into_iter().enumerate() {
        let mut rng = Lcg::new(90 + i as u64);
        let mut x: Vec<u8> = (0..n * 64 * h * h).map(|_| rng.next() as u8).collect();
        let mut k: Vec<i8> = (0..3 * 64 * 9).map(|_| rng.next() as i8).collect();
        x[..64 * h * h].fill(255);
        k[..64 * 9].fill(-128);
        let zx = if i == 0 { 0u8 } else { rng.next() as u8 };
        let at = |b: usize, c: usize, r: i64, s: i64| -> i64 {
            if r < 0 || s < 0 || r >= h as i64 || s >= h as i64 {
                return 0;
            }
            x[((b * 64 + c) * h + r as usize) * h + s as usize] as i64 - zx as i64
        };
        let mut want = Vec::with_capacity(n * 3 * h * h);
        for b in 0..n {
            for o in 0..3 {
                for r in 0..h as i64 {
                    for s in 0..h as i64 {
                        let mut sum = 0i64;
                        for c in 0..64 {
                            for (dr, ds) in (0..9).map(|t| (t / 3, t % 3)) {
                                let w = k[((o * 64 + c) * 3 + dr as usize) * 3 + ds as usize] as i64;
                                sum += at(b, c, r + dr - 1, s + ds - 1) * w;
                            }
                        }
                        want.push(sum as i32);
                    }
                }
            }
        }
        let ins = [
            ("x", Tensor::new(vec![n, 64, h, h], Elems::U8(x)).expect("x")),
            ("k", Tensor::new(vec![3, 64, 3, 3], Elems::I8(k)).expect("k")),
            ("zx", Tensor::new(vec![], Elems::U8(vec![zx])).expect("zx")),
        ];
        let got = cm.run(&ins).expect("runs");
        assert_eq!(got[0].1.elems(), &Elems::I32(want), "n {n} h {h}");
    }
}

/// A reduction of the whole input used by every point (a dynamic
/// quantization's range): stored once per call by a program of its own (its
/// reduction split over the threads), which the rows' program reads, not
/// reduced again per row or per part of the rows; a call with no rows
/// computes nothing. Against the interpreter at no rows, one point, primes
/// and rows split over both threads.
#[test]
fn a_whole_input_reduction_in_a_nest_of_rows() {
    let text = "graph {
  sym n param 0..
  sym m param 1..
  input %x: f32[n, m]
  %mx: f32[] = reduce_max[axes=[0, 1], keep_dims=false] %x
  %m1: f32[1, 1] = reshape %mx
  %mb: f32[n, m] = broadcast %m1
  %q: f32[n, m] = div %x, %mb
  %y: f32[n, m] = round %q
  output %y
}
";
    let m = model(text, true, None);
    let plan = anyshape::inspect::print_plan(&m.lower().expect("lowers"));
    assert!(
        plan.contains("max(i0 < d2, i1 < d3") && plan.contains("round(div(%0[i0, i1], %1[]))"),
        "the rows do not read a stored reduction:\n{plan}"
    );
    for (i, (n, len)) in [(0, 5), (1, 1), (3, 17), (7, 64), (5_001, 3), (2, 40_003)].into_iter().enumerate() {
        compare_from(&m, &[("n", n), ("m", len)], 200 + i as u64, 3.0)
            .unwrap_or_else(|e| panic!("n={n} m={len}: {e}"));
    }
}

/// A softmax over the one row of a `[1, m]` input (a classifier's last step):
/// its reductions read no loop variable, and a long row keeps its terms in a
/// row scratch that the reductions fill as they are computed, so they stay in
/// the row. Against the interpreter at short and long rows.
#[test]
fn a_single_rows_softmax_with_its_scratch() {
    let text = "graph {
  sym m param 1..
  input %x: f32[1, m]
  %mx: f32[1, 1] = reduce_max[axes=[1], keep_dims=true] %x
  %mb: f32[1, m] = broadcast %mx
  %d: f32[1, m] = sub %x, %mb
  %e: f32[1, m] = exp %d
  %s: f32[1, 1] = reduce_sum[axes=[1], keep_dims=true] %e
  %sb: f32[1, m] = broadcast %s
  %y: f32[1, m] = div %e, %sb
  output %y
}
";
    let m = model(text, true, None);
    for (i, len) in [1usize, 17, 1000, 4097, 40_000].into_iter().enumerate() {
        compare(&m, &[("m", len)], 300 + i as u64).unwrap_or_else(|e| panic!("m={len}: {e}"));
    }
}

/// Float-to-integer casts in vectors (the lanes converted together, not one by
/// one) keep the interpreter's saturation: out-of-range values go to the type's
/// ends, NaN to zero, values just under and past 2^31 and 2^63 included, for
/// every integer type, over vectors and their tails.
#[test]
fn float_to_integer_casts_saturate_in_vectors() {
    let text = "graph {
  sym n param 1..100
  input %x: f32[n]
  %i: i32[n] = cast %x
  %b: i8[n] = cast %x
  %u: u8[n] = cast %x
  %l: i64[n] = cast %x
  output %i, %b, %u, %l
}
";
    let m = model(text, false, None);
    let cm = m.compile(&CompileOptions::new().threads(2).canaries(true)).expect("compiles");
    let special = [
        0.0,
        -0.0,
        0.5,
        -0.5,
        1.9,
        -1.9,
        127.9,
        128.0,
        -128.9,
        -129.0,
        255.0,
        255.9,
        256.0,
        -1.0,
        2_147_483_520.0,
        2_147_483_648.0,
        -2_147_483_648.0,
        -2_147_483_904.0,
        3e10,
        -3e10,
        9.223_371_5e18,
        9.223_372e18,
        -9.223_372e18,
        1e30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
    ];
    for n in [1usize, 7, 16, 17, 28, 45, 97] {
        let x: Vec<f32> = (0..n).map(|i| special[(i * 5) % special.len()]).collect();
        let ins = [("x", Tensor::new(vec![n], Elems::F32(x)).expect("x"))];
        let (got, want) = (cm.run(&ins).expect("runs"), m.interpret(&ins).expect("interprets"));
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            assert_eq!(g.elems(), w.elems(), "{name} at n {n}");
        }
    }
}

/// Quantizations in loop programs (`cast<i32>`, a zero point's add, clamps,
/// the narrowing cast), which the code generator computes in f32: the
/// interpreter's integers, bit for bit, for u8 and i8 codes with zero points
/// of either sign or none, bounds past f32's exact integers (i32 arithmetic),
/// at NaN, the infinities, signed zeros, halves, and where the saturated
/// integer plus the zero point wraps past i32 (2^31 minus the zero point and
/// its neighbours), over vectors and their tails. The same after `round`
/// (a quantization's: AVX-512 rounds and converts in one instruction).
#[test]
fn quantizations_in_loops_are_the_interpreters_integers() {
    // (zero point, lo, hi, the narrow type the codes are cast to)
    let forms = [
        (0, 0, 255, "u8"),
        (134, 0, 255, "u8"),
        (-7, -128, 127, "i8"),
        (9, -128, 127, "i8"),
        (0, -100, 100, "i32"),
        (-3, 20_000_000, 30_000_000, "i32"),
    ];
    let mut text = String::from(
        "graph {\n  sym n param 1..100\n  input %x: f32[n]\n  %xi: i32[n] = cast %x\n  \
         %xr: f32[n] = round %x\n  %xri: i32[n] = cast %xr\n",
    );
    let mut outs = Vec::new();
    let rounded = forms.iter().map(|f| (f, "xri"));
    for (i, ((z, lo, hi, ty), from)) in forms.iter().map(|f| (f, "xi")).chain(rounded).enumerate() {
        text += &format!(
            "  %z{i}: i32[1] = constant [{z}]
  %zb{i}: i32[n] = broadcast %z{i}
  %s{i}: i32[n] = add %{from}, %zb{i}
  %lo{i}: i32[1] = constant [{lo}]
  %lob{i}: i32[n] = broadcast %lo{i}
  %hi{i}: i32[1] = constant [{hi}]
  %hib{i}: i32[n] = broadcast %hi{i}
  %a{i}: i32[n] = max %s{i}, %lob{i}
  %c{i}: i32[n] = min %a{i}, %hib{i}
  %q{i}: {ty}[n] = cast %c{i}
  %f{i}: f32[n] = cast %q{i}
"
        );
        outs.push(format!("%q{i}"));
        outs.push(format!("%f{i}"));
    }
    text += &format!("  output {}\n}}\n", outs.join(", "));
    let m = model(&text, false, None);
    let cm = m.compile(&CompileOptions::new().threads(2).canaries(true)).expect("compiles");
    let mut special = vec![
        0.0,
        -0.0,
        0.4,
        -0.4,
        0.5,
        -0.5,
        1.9,
        -1.9,
        127.9,
        -128.9,
        255.0,
        255.9,
        -1.0,
        16_777_215.0,
        16_777_217.0,
        -16_777_217.0,
        25_000_000.0,
        2_147_483_520.0,
        2_147_483_648.0,
        -2_147_483_648.0,
        -2_147_483_904.0,
        3e10,
        -3e10,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
    ];
    for (z, ..) in forms {
        for edge in [2_147_483_648.0f64 - f64::from(z), -2_147_483_648.0 - f64::from(z)] {
            let e = edge as f32;
            special.extend([e, e.next_up(), e.next_down()]);
        }
    }
    for n in [1usize, 7, 16, 17, 45, 97] {
        for shift in [0, 1, 2] {
            let x: Vec<f32> = (0..n).map(|i| special[(i * 5 + shift * n) % special.len()]).collect();
            let ins = [("x", Tensor::new(vec![n], Elems::F32(x)).expect("x"))];
            let (got, want) = (cm.run(&ins).expect("runs"), m.interpret(&ins).expect("interprets"));
            for ((name, g), (_, w)) in got.iter().zip(&want) {
                let bits = |t: &Tensor| match t.elems() {
                    Elems::F32(v) => v.iter().map(|f| f.to_bits().to_string()).collect::<Vec<_>>(),
                    _ => vec![format!("{:?}", t.elems())],
                };
                assert_eq!(bits(g), bits(w), "{name} at n {n}, shift {shift}");
            }
        }
    }
}

/// The model of graph `text` whose constant `@w8` is `weight`, and its plan's text.
/// The head of a graph whose `%y` is the product of a quantized activation
/// `%q` (`input` type, `K = k`, its zero point `zp`) by the int8 weight `@w8`
/// (`k × 7`), both dequantized by a scale: `%a · %b`.
fn dequantized_product(k: usize, input: &str, zp: i32) -> String {
    format!(
        "graph {{
  sym m param 1..
  input %q: {input}[m, {k}]
  %w: i8[{k}, 7] = constant @w8
  %zp: f32[1, 1] = constant [{zp}.0]
  %sa: f32[1, 1] = constant [0.0125]
  %sw: f32[1, 1] = constant [0.003]
  %qf: f32[m, {k}] = cast %q
  %zb: f32[m, {k}] = broadcast %zp
  %x: f32[m, {k}] = sub %qf, %zb
  %sab: f32[m, {k}] = broadcast %sa
  %a: f32[m, {k}] = mul %x, %sab
  %wf: f32[{k}, 7] = cast %w
  %swb: f32[{k}, 7] = broadcast %sw
  %b: f32[{k}, 7] = mul %wf, %swb
  %y: f32[m, 7] = matmul %a, %b
"
    )
}

fn with_int8_weight(text: &str, weight: Tensor) -> (Model, String) {
    with_weights(text, &[("w8", weight)])
}

/// The model of graph `text` whose constants `@NAME` are the named tensors, and its plan's text.
fn with_weights(text: &str, weights: &[(&str, Tensor)]) -> (Model, String) {
    let bind = |name: &str| {
        let (_, t) = weights.iter().find(|(n, _)| *n == name)?;
        Some(std::sync::Arc::new(ir::ConstData::from_tensor(t)))
    };
    let g = ir::parse_graph(text, &bind).unwrap_or_else(|e| panic!("{e}"));
    let m = Model::from_ir(g, &LoadOptions::new()).unwrap_or_else(|e| panic!("{e}"));
    let plan = anyshape::inspect::print_plan(&m.lower().expect("lowers"));
    (m, plan)
}

/// A matmul of a dynamically quantized activation (`u8 - zero point`) by an
/// int8 weight: the zero point moves out (`x·B - z·colsum(B)`), so both operands
/// are 8-bit integers, multiplied by the u8s8 family where the machine has VNNI,
/// by the i16 one (always, and by default without VNNI) and by the f32 family
/// (`Int8::Float`), equal to the exact integer sums in every case: 300 deep in
/// one product, 700 deep in chunks of K (the extremes past 2^24 included).
#[test]
fn quantized_activations_by_int8_weights_move_their_zero_point_out() {
    for k in [300usize, 700] {
        let text = format!(
            "graph {{
  sym m param 1..
  input %a: u8[m, {k}]
  input %za: u8[]
  %w: i8[{k}, 5] = constant @w8
  %ai: i32[m, {k}] = cast %a
  %zi: i32[] = cast %za
  %z1: i32[1, 1] = reshape %zi
  %zb: i32[m, {k}] = broadcast %z1
  %as: i32[m, {k}] = sub %ai, %zb
  %wi: i32[{k}, 5] = cast %w
  %y: i32[m, 5] = matmul %as, %wi
  output %y
}}
"
        );
        let mut rng = Lcg::new(k as u64);
        let mut w: Vec<i8> = (0..k * 5).map(|_| rng.next() as i8).collect();
        for r in 0..k {
            w[r * 5] = -128;
            w[r * 5 + 1] = 127;
        }
        let (m, plan) = with_int8_weight(&text, Tensor::new(vec![k, 5], Elems::I8(w.clone())).expect("w"));
        assert!(plan.contains("(u8·s8)"), "no u8·s8 product at K {k}:\n{plan}");
        let vnni = kernels::Target::detect().check_elem(kernels::ElemType::U8S8).is_ok();
        for int8 in [Int8::Auto, Int8::U8S8, Int8::I16S8, Int8::I16, Int8::Float] {
            let opts = CompileOptions::new().threads(2).canaries(true).int8(int8);
            if int8 == Int8::U8S8 && !vnni {
                let e = m.compile(&opts).err().expect("u8s8 without VNNI is refused").to_string();
                assert!(e.contains("VNNI"), "{e}");
                continue;
            }
            let cm = m.compile(&opts).expect("compiles");
            let kinds = cm.kernels_text();
            let want = match int8 {
                Int8::Auto if vnni => Some("u8s8"),
                Int8::U8S8 => Some("u8s8"),
                Int8::Auto | Int8::I16S8 => Some("i16s8"),
                Int8::I16 => Some("i16"),
                Int8::Float => None,
            };
            for e in ["u8s8", "i16s8", "i16"] {
                let has = kinds.contains(&format!("micro-kernels in {e} "));
                assert_eq!(has, want == Some(e), "{int8:?}: {kinds}");
            }
            for (i, rows) in [1usize, 2, 7, 17, 65].into_iter().enumerate() {
                let mut a: Vec<u8> = (0..rows * k).map(|_| rng.next() as u8).collect();
                a[..k].fill(255);
                let za = if i % 2 == 0 { 0u8 } else { rng.next() as u8 };
                let want: Vec<i32> = (0..rows * 5)
                    .map(|x| {
                        let (r, c) = (x / 5, x % 5);
                        let s: i64 =
                            (0..k).map(|p| (a[r * k + p] as i64 - za as i64) * w[p * 5 + c] as i64).sum();
                        s as i32
                    })
                    .collect();
                let ins = [
                    ("a", Tensor::new(vec![rows, k], Elems::U8(a)).expect("a")),
                    ("za", Tensor::new(vec![], Elems::U8(vec![za])).expect("za")),
                ];
                let got = cm.run(&ins).expect("runs");
                assert_eq!(got[0].1.elems(), &Elems::I32(want.clone()), "K {k} rows {rows} {int8:?}");
                let interpreted = m.interpret(&ins).expect("interprets");
                assert_eq!(interpreted[0].1.elems(), &Elems::I32(want), "K {k} rows {rows}");
            }
        }
    }
}

/// A dynamic quantization's codes widened to i32 for an integer product by an
/// int8 weight (`MatMulInteger`'s form: the zero point subtracted, the batch
/// merged into rows): the quantizing program stores them a byte a code and
/// the product reads those bytes as its A (no program copies them into a
/// second buffer), where the u8s8 family is the machine's; the interpreter's
/// values exactly, by every int8 family, at rows 1, 2, 7, 17 and 65.
#[test]
fn integer_codes_widened_for_a_product_are_read_in_place() {
    let text = "graph {
  sym m param 1..
  sym n param 1..
  input %x: f32[m, n, 64]
  %w: i8[64, 7] = constant @w8
  %ax: f32[m, n, 64] = abs %x
  %mx: f32[] = reduce_max[axes=[0, 1, 2], keep_dims=false] %ax
  %d: f32[] = constant 127.0
  %s: f32[] = div %mx, %d
  %s2: f32[1, 1, 1] = reshape %s
  %sb: f32[m, n, 64] = broadcast %s2
  %q: f32[m, n, 64] = div %x, %sb
  %r: f32[m, n, 64] = round %q
  %z: f32[1, 1, 1] = constant [128.0]
  %zb: f32[m, n, 64] = broadcast %z
  %rz: f32[m, n, 64] = add %r, %zb
  %lo: f32[1, 1, 1] = constant [0.0]
  %lob: f32[m, n, 64] = broadcast %lo
  %hi: f32[1, 1, 1] = constant [255.0]
  %hib: f32[m, n, 64] = broadcast %hi
  %c0: f32[m, n, 64] = max %rz, %lob
  %c1: f32[m, n, 64] = min %c0, %hib
  %u: u8[m, n, 64] = cast %c1
  %ui: i32[m, n, 64] = cast %u
  %zi: i32[1, 1, 1] = constant [128]
  %zib: i32[m, n, 64] = broadcast %zi
  %as: i32[m, n, 64] = sub %ui, %zib
  %wi: i32[64, 7] = cast %w
  %a2: i32[m*n, 64] = reshape %as
  %y: i32[m*n, 7] = matmul %a2, %wi
  output %y
}
";
    let mut rng = Lcg::new(23);
    let w: Vec<i8> = (0..64 * 7).map(|_| rng.next() as i8).collect();
    let (m, plan) = with_int8_weight(text, Tensor::new(vec![64, 7], Elems::I8(w)).expect("w"));
    let vnni = kernels::Target::detect().check_elem(kernels::ElemType::U8S8).is_ok();
    let programs: Vec<&str> = plan.split("program").skip(1).collect();
    let stores_codes = programs.iter().filter(|p| p.contains(": out u8[")).count();
    let copies = programs.iter().filter(|p| p.contains(": in u8[") && p.contains(": out u8[")).count();
    assert_eq!((stores_codes, copies), (usize::from(vnni), 0), "codes stored once:\n{plan}");
    for int8 in [Int8::Auto, Int8::I16S8, Int8::I16, Int8::Float] {
        let cm = m.compile(&CompileOptions::new().threads(2).canaries(true).int8(int8)).expect("compiles");
        for rows in [1usize, 2, 7, 17, 65] {
            let x: Vec<f32> = (0..rows * 3 * 64).map(|_| rng.unit() * 3.0).collect();
            let ins = [("x", Tensor::new(vec![rows, 3, 64], Elems::F32(x)).expect("x"))];
            let got = cm.run(&ins).expect("runs");
            let want = m.interpret(&ins).expect("interprets");
            assert_eq!(got[0].1.elems(), want[0].1.elems(), "rows {rows} {int8:?}");
        }
    }
}

/// A statically quantized activation (`cast<f32>` of its u8 codes) that a loop
/// program writes, read by a product with an int8 weight (its A) and by an
/// element-wise reader, is stored a byte a code where the u8s8 family takes it
/// (a machine with VNNI): the loop stores the codes, the reader widens them as
/// it loads, and the product reads them as they lie. Every family (u8s8 by the
/// words of the codes, the others byte by byte) gives the interpreter's values
/// exactly, at row counts with 1, primes and one past a tile, and depths that
/// do (64) and do not (30) fill whole words.
#[test]
fn quantized_activations_are_stored_as_codes() {
    for k in [64usize, 30] {
        let text = format!(
            "graph {{
  sym m param 1..
  input %x: f32[m, {k}]
  %w: i8[{k}, 5] = constant @w8
  %s: f32[1, 1] = constant [0.05]
  %sb: f32[m, {k}] = broadcast %s
  %xs: f32[m, {k}] = div %x, %sb
  %xr: f32[m, {k}] = round %xs
  %xi: i32[m, {k}] = cast %xr
  %z: i32[1, 1] = constant [3]
  %zb: i32[m, {k}] = broadcast %z
  %xz: i32[m, {k}] = add %xi, %zb
  %lo: i32[1, 1] = constant [0]
  %lob: i32[m, {k}] = broadcast %lo
  %hi: i32[1, 1] = constant [255]
  %hib: i32[m, {k}] = broadcast %hi
  %c0: i32[m, {k}] = max %xz, %lob
  %c1: i32[m, {k}] = min %c0, %hib
  %q: u8[m, {k}] = cast %c1
  %qf: f32[m, {k}] = cast %q
  %wf: f32[{k}, 5] = cast %w
  %y: f32[m, 5] = matmul %qf, %wf
  %t: f32[1, 1] = constant [0.5]
  %tb: f32[m, {k}] = broadcast %t
  %e: f32[m, {k}] = mul %qf, %tb
  %e2: f32[m, {k}] = sqrt %e
  output %y, %e2
}}
"
        );
        let mut rng = Lcg::new(k as u64 + 3);
        let w: Vec<i8> = (0..k * 5).map(|_| rng.next() as i8).collect();
        let (m, plan) = with_int8_weight(&text, Tensor::new(vec![k, 5], Elems::I8(w)).expect("w"));
        let vnni = kernels::Target::detect().check_elem(kernels::ElemType::U8S8).is_ok();
        assert_eq!(
            plan.contains(&format!("u8[m, {k}] \"qf\"")),
            vnni,
            "codes stored where u8s8 runs:\n{plan}"
        );
        for int8 in [Int8::Auto, Int8::I16S8, Int8::I16, Int8::Float] {
            let cm =
                m.compile(&CompileOptions::new().threads(2).canaries(true).int8(int8)).expect("compiles");
            for rows in [1usize, 2, 7, 17, 65] {
                let x: Vec<f32> = (0..rows * k).map(|_| rng.unit() * 14.0 - 1.0).collect();
                let ins = [("x", Tensor::new(vec![rows, k], Elems::F32(x)).expect("x"))];
                let got = cm.run(&ins).expect("runs");
                let want = m.interpret(&ins).expect("interprets");
                for ((name, g), (_, w)) in got.iter().zip(&want) {
                    assert_eq!(g.elems(), w.elems(), "{name}: K {k} rows {rows} {int8:?}");
                }
            }
        }
    }
}

/// A product by an int8 weight whose epilogue requantizes (round, clamp to
/// u8) and whose output only the next int8 product reads stores its C as
/// codes where the u8s8 family runs and one K block takes its depth (30, 64;
/// 16400 is deeper than [`kernels::schedule::one_block_depth`]: floats): every family gives the
/// interpreter's values exactly, at rows with 1, primes and one past a tile
/// and a width (37) with an edge panel.
#[test]
fn a_requantizing_product_stores_codes() {
    let target = kernels::Target::detect();
    let vnni = target.check_elem(kernels::ElemType::U8S8).is_ok();
    let depth = kernels::schedule::one_block_depth(&target, kernels::ElemType::U8S8);
    for k in [64usize, 30, 16400] {
        let text = format!(
            "graph {{
  sym m param 1..
  input %a: u8[m, {k}]
  %w: i8[{k}, 37] = constant @w8
  %v: i8[37, 3] = constant @v8
  %af: f32[m, {k}] = cast %a
  %wf: f32[{k}, 37] = cast %w
  %y: f32[m, 37] = matmul %af, %wf
  %s: f32[1, 1] = constant [0.0013]
  %sb: f32[m, 37] = broadcast %s
  %ys: f32[m, 37] = mul %y, %sb
  %yr: f32[m, 37] = round %ys
  %yi: i32[m, 37] = cast %yr
  %z: i32[1, 1] = constant [100]
  %zb: i32[m, 37] = broadcast %z
  %yz: i32[m, 37] = add %yi, %zb
  %lo: i32[1, 1] = constant [0]
  %lob: i32[m, 37] = broadcast %lo
  %hi: i32[1, 1] = constant [255]
  %hib: i32[m, 37] = broadcast %hi
  %c0: i32[m, 37] = max %yz, %lob
  %c1: i32[m, 37] = min %c0, %hib
  %yq: u8[m, 37] = cast %c1
  %yf: f32[m, 37] = cast %yq
  %vf: f32[37, 3] = cast %v
  %out: f32[m, 3] = matmul %yf, %vf
  output %out
}}
"
        );
        let mut rng = Lcg::new(k as u64 + 11);
        let w: Vec<i8> = (0..k * 37).map(|_| rng.next() as i8).collect();
        let v: Vec<i8> = (0..37 * 3).map(|_| rng.next() as i8).collect();
        let (m, plan) = with_weights(
            &text,
            &[
                ("w8", Tensor::new(vec![k, 37], Elems::I8(w)).expect("w")),
                ("v8", Tensor::new(vec![37, 3], Elems::I8(v)).expect("v")),
            ],
        );
        assert_eq!(plan.contains("stored as u8 codes"), vnni && k <= depth, "K {k}:\n{plan}");
        for int8 in [Int8::Auto, Int8::I16S8, Int8::I16, Int8::Float] {
            let cm =
                m.compile(&CompileOptions::new().threads(2).canaries(true).int8(int8)).expect("compiles");
            for rows in [1usize, 2, 7, 17, 65] {
                let a: Vec<u8> = (0..rows * k).map(|_| rng.next() as u8).collect();
                let ins = [("a", Tensor::new(vec![rows, k], Elems::U8(a)).expect("a"))];
                let got = cm.run(&ins).expect("runs");
                let want = m.interpret(&ins).expect("interprets");
                assert_eq!(got[0].1.elems(), want[0].1.elems(), "K {k} rows {rows} {int8:?}");
            }
        }
    }
}

/// A residual block's sum of two requantized products (ResNet's, in QDQ
/// form): each product stores its own quantization as u8 codes from its
/// epilogue, where the u8s8 kernels take the product in one K block, and the
/// program that dequantizes, adds and quantizes the sum reads those codes,
/// not the products' f32 outputs; the interpreter's values exactly, by every
/// int8 family, at rows 1, 2, 7, 17 and 65, K 64 (codes) and 16400 (too deep:
/// f32 outputs). The same with int8 quantizations (`quantize_static`'s
/// default activations): their codes are bytes, `q + 128`
/// (`passes::SignedCodesAsBytes`), stored and read the same way.
#[test]
fn a_residual_sum_reads_its_products_codes() {
    let target = kernels::Target::detect();
    let vnni = target.check_elem(kernels::ElemType::U8S8).is_ok();
    let depth = kernels::schedule::one_block_depth(&target, kernels::ElemType::U8S8);
    let requantized = |i: usize, y: &str, s: f32, z: i32, t: f32, signed: bool| {
        let (lo, hi, ty) = if signed { (-128, 127, "i8") } else { (0, 255, "u8") };
        format!(
            "  %s{i}: f32[1, 1] = constant [{s}]
  %sb{i}: f32[m, 37] = broadcast %s{i}
  %ys{i}: f32[m, 37] = mul {y}, %sb{i}
  %yr{i}: f32[m, 37] = round %ys{i}
  %yi{i}: i32[m, 37] = cast %yr{i}
  %z{i}: i32[1, 1] = constant [{z}]
  %zb{i}: i32[m, 37] = broadcast %z{i}
  %yz{i}: i32[m, 37] = add %yi{i}, %zb{i}
  %lo{i}: i32[1, 1] = constant [{lo}]
  %lob{i}: i32[m, 37] = broadcast %lo{i}
  %hi{i}: i32[1, 1] = constant [{hi}]
  %hib{i}: i32[m, 37] = broadcast %hi{i}
  %c{i}: i32[m, 37] = max %yz{i}, %lob{i}
  %d{i}: i32[m, 37] = min %c{i}, %hib{i}
  %q{i}: {ty}[m, 37] = cast %d{i}
  %qf{i}: f32[m, 37] = cast %q{i}
  %zf{i}: f32[1, 1] = constant [{z}.0]
  %zfb{i}: f32[m, 37] = broadcast %zf{i}
  %qz{i}: f32[m, 37] = sub %qf{i}, %zfb{i}
  %t{i}: f32[1, 1] = constant [{t}]
  %tb{i}: f32[m, 37] = broadcast %t{i}
  %dq{i}: f32[m, 37] = mul %qz{i}, %tb{i}
"
        )
    };
    let cases = [(64usize, false), (16400, false), (64, true), (16400, true)];
    for (signed, (k, widened)) in [false, true].into_iter().flat_map(|s| cases.map(|c| (s, c))) {
        let (lo, hi, ty) = if signed { (-128, 127, "i8") } else { (0, 255, "u8") };
        let case = format!("K {k}, widened {widened}, signed {signed}");
        // Widened: the sum's codes as floats (what a next product or an
        // output reads), which the second product's epilogue computes,
        // reading the first one's output as its residual.
        let out = if widened { "  %outf: f32[m, 37] = cast %out\n  output %outf" } else { "  output %out" };
        let text = format!(
            "graph {{
  sym m param 1..
  input %a: u8[m, {k}]
  input %b: u8[m, {k}]
  %w: i8[{k}, 37] = constant @w8
  %v: i8[{k}, 37] = constant @v8
  %af: f32[m, {k}] = cast %a
  %bf: f32[m, {k}] = cast %b
  %wf: f32[{k}, 37] = cast %w
  %vf: f32[{k}, 37] = cast %v
  %y0: f32[m, 37] = matmul %af, %wf
  %y1: f32[m, 37] = matmul %bf, %vf
{}{}  %sum: f32[m, 37] = add %dq0, %dq1
  %so: f32[1, 1] = constant [0.37]
  %sob: f32[m, 37] = broadcast %so
  %o: f32[m, 37] = div %sum, %sob
  %or: f32[m, 37] = round %o
  %oi: i32[m, 37] = cast %or
  %olo: i32[1, 1] = constant [{lo}]
  %olob: i32[m, 37] = broadcast %olo
  %ohi: i32[1, 1] = constant [{hi}]
  %ohib: i32[m, 37] = broadcast %ohi
  %oc: i32[m, 37] = max %oi, %olob
  %od: i32[m, 37] = min %oc, %ohib
  %out: {ty}[m, 37] = cast %od
{out}
}}
",
            requantized(0, "%y0", 0.0013, if signed { 6 } else { 134 }, 0.21, signed),
            requantized(1, "%y1", 0.0021, if signed { -20 } else { 9 }, 0.17, signed)
        );
        let mut rng = Lcg::new(k as u64 + 5);
        let mut weight = || {
            let w: Vec<i8> = (0..k * 37).map(|_| rng.next() as i8).collect();
            Tensor::new(vec![k, 37], Elems::I8(w)).expect("weight")
        };
        let (m, plan) = with_weights(&text, &[("w8", weight()), ("v8", weight())]);
        let codes = vnni && k <= depth;
        if widened {
            // No program is left: the first product's output is the residual,
            // its codes where it stores them. (Without VNNI the products read
            // their A as f32: its casts are the only programs.)
            if vnni {
                assert!(!plan.contains("program g"), "{case}:\n{plan}");
            } else {
                for p in plan.split(": program ").skip(1) {
                    let body =
                        p.lines().take_while(|l| !l.starts_with("group ")).filter(|l| l.contains("] = "));
                    for l in body {
                        assert!(l.trim_start().starts_with("%1[·] = cast<f32>(%0["), "{case}:\n{plan}");
                    }
                }
            }
            assert_eq!(plan.matches("reading residual b").count(), 1, "{case}:\n{plan}");
            assert_eq!(plan.contains("(u8 codes)"), codes, "{case}:\n{plan}");
        } else {
            assert_eq!(
                plan.matches("stored as u8 codes").count(),
                if codes { 2 } else { 0 },
                "{case}:\n{plan}"
            );
            let sum = plan
                .split("program")
                .find(|p| p.lines().any(|l| l.contains(&format!(": out {ty}[")) && l.ends_with("\"out\"")))
                .unwrap_or_default();
            assert_eq!(sum.matches(": in u8[").count(), if codes { 2 } else { 0 }, "{case}:\n{plan}");
        }
        let mut rng = Lcg::new(k as u64 + 17);
        for int8 in [Int8::Auto, Int8::I16S8, Int8::I16, Int8::Float] {
            let cm =
                m.compile(&CompileOptions::new().threads(2).canaries(true).int8(int8)).expect("compiles");
            for rows in [1usize, 2, 7, 17, 65] {
                let mut codes = || {
                    let a: Vec<u8> = (0..rows * k).map(|_| rng.next() as u8).collect();
                    Tensor::new(vec![rows, k], Elems::U8(a)).expect("codes")
                };
                let ins = [("a", codes()), ("b", codes())];
                let got = cm.run(&ins).expect("runs");
                let want = m.interpret(&ins).expect("interprets");
                assert_eq!(got[0].1.elems(), want[0].1.elems(), "{case} rows {rows} {int8:?}");
            }
        }
    }
}

/// A dynamic quantization's `round(x / scale)` with the scale computed per
/// call (a divisor the same for every row): the compiled division is the
/// interpreter's, exactly, in the vectors of a row and in its masked tail (a
/// reciprocal's product, one ulp off, moved values across a rounding
/// boundary), at row lengths with 1, primes and one past a vector.
#[test]
fn a_quantizing_division_is_exact_in_every_lane() {
    let text = "graph {
  sym n param 1..
  sym m param 1..
  input %x: f32[n, m]
  %a: f32[n, m] = abs %x
  %mx: f32[] = reduce_max[axes=[0, 1], keep_dims=false] %a
  %c: f32[] = constant 127.0
  %s: f32[] = div %mx, %c
  %s1: f32[1, 1] = reshape %s
  %sb: f32[n, m] = broadcast %s1
  %q: f32[n, m] = div %x, %sb
  %r: f32[n, m] = round %q
  output %r
}
";
    let m = model(text, false, None);
    let cm = m.compile(&CompileOptions::new().threads(2).canaries(true)).expect("compiles");
    let mut rng = Lcg::new(127);
    for (n, k) in [(1usize, 1usize), (3, 7), (2, 16), (4, 17), (5, 31), (2, 67), (3, 130)] {
        for _ in 0..20 {
            // Values a half step from a rounding boundary (the scale fixed by the
            // first, the largest): where the two quotients differ by an ulp.
            let s = 100.0f32 / 127.0;
            let mut x: Vec<f32> = (0..n * k)
                .map(|_| ((rng.next() % 240) as f32 - 119.5) * s * (1.0 + rng.unit() * 1e-7))
                .collect();
            x[0] = 100.0;
            let ins = [("x", Tensor::new(vec![n, k], Elems::F32(x)).expect("x"))];
            let got = cm.run(&ins).expect("runs");
            let want = m.interpret(&ins).expect("interprets");
            assert_eq!(got[0].1.elems(), want[0].1.elems(), "{n}x{k}");
        }
    }
}

/// A convolution of a quantized image with a zero point (`x - 109` of u8
/// codes, a QDQ model's RGB stem; `x + 7` of int8 codes, `quantize_static`'s
/// default) through its zero padding: the zero point moves out of the product
/// (`passes::MoveZeroPointOut`: the image padded with 109, the product less
/// `109·colsum(W)`; the int8 image shifted to bytes, `x + 128`, padded with
/// 121, the product less `121·colsum(W)`), so the product is u8·s8 where it
/// was i16·s8; every family gives the interpreter's values exactly, at image
/// sizes with 1, primes and a stride's remainder.
#[test]
fn a_zero_point_moves_out_of_a_padded_convolution() {
    for (codes, z) in [("u8", "109.0"), ("i8", "-7.0")] {
        let text = format!(
            "graph {{
  sym h param 1..
  sym w param 1..
  input %x: {codes}[1, 3, h, w]
  %w8: i8[8, 3, 3, 3] = constant @w8
  %wf: f32[8, 3, 3, 3] = cast %w8
  %xf: f32[1, 3, h, w] = cast %x
  %z: f32[1, 1, 1, 1] = constant [{z}]
  %zb: f32[1, 3, h, w] = broadcast %z
  %xs: f32[1, 3, h, w] = sub %xf, %zb
  %y: f32[1, 8, (h-1)/2+1, (w-1)/2+1] = conv[strides=[2, 2], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=1] %xs, %wf
  output %y
}}
"
        );
        let mut rng = Lcg::new(109);
        let w: Vec<i8> = (0..8 * 27).map(|_| rng.next() as i8).collect();
        let (m, plan) = with_int8_weight(&text, Tensor::new(vec![8, 3, 3, 3], Elems::I8(w)).expect("w"));
        assert!(
            plan.contains("(u8·s8)") && !plan.contains("(i16"),
            "{codes}: the zero point stays in:\n{plan}"
        );
        for int8 in [Int8::Auto, Int8::I16S8, Int8::Float] {
            let cm =
                m.compile(&CompileOptions::new().threads(2).canaries(true).int8(int8)).expect("compiles");
            for (h, w) in [(1usize, 1usize), (2, 7), (5, 5), (13, 8), (17, 23)] {
                let x = match codes {
                    "u8" => Elems::U8((0..3 * h * w).map(|_| rng.next() as u8).collect()),
                    _ => Elems::I8((0..3 * h * w).map(|_| rng.next() as i8).collect()),
                };
                let ins = [("x", Tensor::new(vec![1, 3, h, w], x).expect("x"))];
                let got = cm.run(&ins).expect("runs");
                let want = m.interpret(&ins).expect("interprets");
                assert_eq!(got[0].1.elems(), want[0].1.elems(), "{codes} {h}x{w} {int8:?}");
            }
        }
    }
}

/// A statically quantized product (QDQ: an int8 activation with a zero point
/// and a per-tensor int8 weight, both dequantized, then an f32 matmul): both
/// scales move to the product, which multiplies the integers unless asked for
/// floats: shallow enough that every partial sum is exact in f32 (K = 96), the
/// signed codes shifted to bytes, `(q + 128) - (z + 128)`, and the zero point
/// moved out (`passes::MoveZeroPointOut`: u8·s8); deeper (K = 1000), the
/// same where each column's weights sum (positive and negative apart) far
/// enough below 2^24 / 255 that every partial sum is exact still, and on the
/// i16s8 family where one column's weights are all 127 (the activation is
/// signed, so not u8s8 even with VNNI; i16 when asked). Each matches the
/// interpreter's f32 product of the dequantized values to f32 rounding, at
/// depths one K block and several deep and row counts with 1, primes and one
/// past a tile.
#[test]
fn a_dequantized_product_multiplies_integers() {
    for (k, heavy) in [(96usize, false), (1000, false), (1000, true)] {
        let text = format!(
            "{}  %r: f32[m, {k}] = neg %a
  output %y, %r
}}
",
            dequantized_product(k, "i8", 5)
        );
        let mut rng = Lcg::new(k as u64 + 7);
        let mut w: Vec<i8> = (0..k * 7).map(|_| rng.next() as i8).collect();
        w[..7].copy_from_slice(&[-128, 127, -128, 127, 0, 1, -1]);
        if heavy {
            (0..k).for_each(|d| w[d * 7 + 3] = 127);
        }
        let (m, plan) = with_int8_weight(&text, Tensor::new(vec![k, 7], Elems::I8(w)).expect("w"));
        let shifted = !heavy;
        let mark = if shifted { "(weight) (u8·s8)" } else { "(weight) (i16·s8)" };
        assert!(plan.contains(mark), "no {mark} product at K {k} (heavy: {heavy}):\n{plan}");
        for int8 in [Int8::Auto, Int8::I16, Int8::Float] {
            let cm =
                m.compile(&CompileOptions::new().threads(2).canaries(true).int8(int8)).expect("compiles");
            let kinds = cm.kernels_text();
            let want = match int8 {
                Int8::Auto => Some("i16s8"),
                Int8::I16 => Some("i16"),
                _ => None,
            };
            for e in ["i16s8", "i16"] {
                let has = kinds.contains(&format!("micro-kernels in {e} "));
                assert!(shifted || has == (want == Some(e)), "{int8:?}: {kinds}");
            }
            for rows in [1usize, 2, 7, 17, 65] {
                let mut q: Vec<i8> = (0..rows * k).map(|_| rng.next() as i8).collect();
                q[..k].fill(-128);
                let ins = [("q", Tensor::new(vec![rows, k], Elems::I8(q)).expect("q"))];
                let got = cm.run(&ins).expect("runs");
                let want = m.interpret(&ins).expect("interprets");
                for ((name, g), (_, w)) in got.iter().zip(&want) {
                    let (Elems::F32(g), Elems::F32(w)) = (g.elems(), w.elems()) else {
                        panic!("f32 outputs")
                    };
                    let norm = w.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
                    let err =
                        g.iter().zip(w).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum::<f64>().sqrt();
                    assert!(err <= 1e-6 * norm, "{name} K {k} rows {rows} {int8:?}: {err} of {norm}");
                }
            }
        }
    }
}

/// A statically quantized product (u8 activations less their zero point, s8
/// weights) whose output is quantized again, as a QDQ model stores it:
/// divided by the output's scale, rounded, its zero point added, clamped to
/// u8. The requantization is the product's epilogue, its scales parameters
/// of the kernel (not constants compiled into it); the codes equal the
/// interpreter's at every row count. With a zero point moved out of the
/// product (`x·W - z·colsum(W)`), the epilogue subtracts that integer column
/// term before it scales, as the graph does (a column scale and bias folding
/// the scales into both terms would round some values to the next code).
#[test]
fn a_requantized_product_stores_its_codes_from_the_epilogue() {
    for (k, zp) in [(96usize, 0), (1000, 7)] {
        let text = format!(
            "{}  %so: f32[1, 1] = constant [0.011]
  %sob: f32[m, 7] = broadcast %so
  %d: f32[m, 7] = div %y, %sob
  %rd: f32[m, 7] = round %d
  %ri: i32[m, 7] = cast %rd
  %zo: i32[1, 1] = constant [3]
  %zob: i32[m, 7] = broadcast %zo
  %rz: i32[m, 7] = add %ri, %zob
  %lo: i32[1, 1] = constant [0]
  %lob: i32[m, 7] = broadcast %lo
  %hi: i32[1, 1] = constant [255]
  %hib: i32[m, 7] = broadcast %hi
  %c0: i32[m, 7] = max %rz, %lob
  %c1: i32[m, 7] = min %c0, %hib
  %u: u8[m, 7] = cast %c1
  %codes: f32[m, 7] = cast %u
  output %codes
}}
",
            dequantized_product(k, "u8", zp)
        );
        let mut rng = Lcg::new(k as u64 + 11);
        let mut w: Vec<i8> = (0..k * 7).map(|_| rng.next() as i8).collect();
        w[..7].copy_from_slice(&[-128, 127, -128, 127, 0, 1, -1]);
        let (m, plan) = with_int8_weight(&text, Tensor::new(vec![k, 7], Elems::I8(w)).expect("w"));
        let product = plan.lines().find(|l| l.contains("matmul")).unwrap_or_default();
        assert!(
            product.contains("integer(round(") && product.contains(" with "),
            "the requantization is not the product's parameterized epilogue:\n{product}"
        );
        // (The input's widening to f32 before the product is a loop program.)
        if zp != 0 {
            assert!(
                product.contains("(u8·s8)") && product.contains("bias") && !product.contains("column scale"),
                "the zero point's share is not subtracted before the scales:\n{product}"
            );
        }
        let after = plan.split_once("  matmul").map_or("", |(_, rest)| rest);
        assert!(!after.contains("  loop"), "a loop program is left after the product:\n{plan}");
        let cm = m.compile(&CompileOptions::new().threads(2).canaries(true)).expect("compiles");
        let mut seen = Vec::new();
        for rows in [1usize, 2, 7, 17, 65] {
            let q: Vec<u8> = (0..rows * k).map(|_| rng.next() as u8).collect();
            let ins = [("q", Tensor::new(vec![rows, k], Elems::U8(q)).expect("q"))];
            let got = cm.run(&ins).expect("runs");
            let want = m.interpret(&ins).expect("interprets");
            let (Elems::F32(g), Elems::F32(w)) = (got[0].1.elems(), want[0].1.elems()) else {
                panic!("f32 outputs")
            };
            assert_eq!(g, w, "K {k} zero point {zp} rows {rows}");
            seen.extend_from_slice(w);
        }
        assert!(seen.contains(&0.0) && seen.contains(&255.0), "clamps untested: {seen:?}");
    }
}

/// A global mean over a channels-last image of one batch entry (a pool of
/// many channels, each a sum over the pixels): a one-loop nest of points
/// whose one reduction may split over the threads. Against the interpreter at
/// channel counts past, at and under a vector's lanes, and pixel counts from
/// one to past a split's chunk.
#[test]
fn a_channels_last_global_mean_of_one_image() {
    let text = "graph {
  sym h param 1..
  sym c param 1..
  input %x: f32[1, h, h, c]
  %m: f32[1, 1, 1, c] = reduce_mean[axes=[1, 2], keep_dims=true] %x
  output %m
}
";
    let m = model(text, true, None);
    for (i, (h, c)) in [(13, 1000), (1, 1000), (13, 7), (7, 2048), (30, 33), (100, 5)].into_iter().enumerate()
    {
        compare(&m, &[("h", h), ("c", c)], 400 + i as u64).unwrap_or_else(|e| panic!("h={h} c={c}: {e}"));
    }
}

/// A softmax over a global mean of a product's channels-last output, seen
/// channels-first (SqueezeNet's head; the mean is not moved below the view,
/// see `passes::SinkTransposes`). Against the interpreter on the graph as
/// written.
#[test]
fn a_softmax_over_a_channels_last_global_mean() {
    let text = "graph {
  sym h param 1..
  input %x: f32[1, h, h, 16]
  %x2: f32[h*h, 16] = reshape %x
  %w: f32[16, 1000] = constant @w1000
  %p: f32[h*h, 1000] = matmul %x2, %w
  %p4: f32[1, h, h, 1000] = reshape %p
  %t: f32[1, 1000, h, h] = transpose[perm=[0, 3, 1, 2]] %p4
  %r: f32[1, 1000, h, h] = relu %t
  %m: f32[1, 1000, 1, 1] = reduce_mean[axes=[2, 3], keep_dims=true] %r
  %mx: f32[1, 1, 1, 1] = reduce_max[axes=[1], keep_dims=true] %m
  %mxb: f32[1, 1000, 1, 1] = broadcast %mx
  %d: f32[1, 1000, 1, 1] = sub %m, %mxb
  %e: f32[1, 1000, 1, 1] = exp %d
  %s: f32[1, 1, 1, 1] = reduce_sum[axes=[1], keep_dims=true] %e
  %sb: f32[1, 1000, 1, 1] = broadcast %s
  %y: f32[1, 1000, 1, 1] = div %e, %sb
  output %y
}
";
    for (i, h) in [13usize, 1, 7].into_iter().enumerate() {
        // The dims known when compiling, as in SqueezeNet.
        let text = text.replace("param 1..", &format!("param {h}..{h}"));
        let (rewritten, written) = (model(&text, true, None), model(&text, false, None));
        let plan = anyshape::inspect::print_plan(&rewritten.lower().expect("lowers"));
        let cm = rewritten.compile(&CompileOptions::new().threads(2)).expect("compiles");
        let ins = inputs(&rewritten, &[("h", h)], 500 + i as u64);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let want = written.interpret(&named).expect("interprets");
        let got = cm.run(&named).expect("runs");
        let (g, w) = (got[0].1.to_f64_vec(), want[0].1.to_f64_vec());
        for (j, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "h={h} [{j}] {a} against {b}\n{plan}");
        }
    }
}

/// A channels-last product's rows read back as an NCHW image: the unit axis at
/// 0 and the row index whole (no division per element), against the
/// interpreter at random images (the skip input gives the image's dims).
const ROWS_AS_IMAGE: &str = r#"graph {
  sym n param 1..
  sym h param 1..
  sym w param 1..
  input %x: f32[1, n*h*w, 5]
  input %skip: f32[n, 5, h, w]
  %r: f32[n, h, w, 5] = reshape %x
  %t: f32[n, 5, h, w] = transpose[perm=[0, 3, 1, 2]] %r
  %s: f32[n, 5, h, w] = add %t, %skip
  %y: f32[n, 5, h, w] = relu %s
  output %y
}
"#;

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    #[test]
    fn rows_read_as_an_image(n in size(1, 4), h in size(1, 17), w in size(1, 17), seed in 0u64..1000) {
        compare(&model(ROWS_AS_IMAGE, false, None), &[("n", n), ("h", h), ("w", w)], seed)?;
    }
}

/// Codes a product reads and their scaled copy a later add reads (a quantized
/// residual block's shape): the copy computed by the add's group from the
/// codes, against the interpreter at random row counts.
const SCALED_COPY_READ_LATER: &str = r#"graph {
  sym n param 1..
  input %x: f32[n, 6]
  input %w1: f32[6, 5]
  input %w2: f32[5, 5]
  %h: f32[n, 5] = matmul %x, %w1
  %codes: f32[n, 5] = round %h
  %s: f32[1, 1] = constant [0.37]
  %sb: f32[n, 5] = broadcast %s
  %copy: f32[n, 5] = mul %codes, %sb
  %h2: f32[n, 5] = matmul %codes, %w2
  %sum: f32[n, 5] = add %h2, %copy
  output %sum
}
"#;

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    #[test]
    fn a_scaled_copy_read_later(n in size(1, 70), seed in 0u64..1000) {
        compare(&model(SCALED_COPY_READ_LATER, false, None), &[("n", n)], seed)?;
    }
}

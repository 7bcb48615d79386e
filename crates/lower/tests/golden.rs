//! Golden text of lowered programs: a stitch (layer norm over the last axis,
//! its two row reductions computed per row), a softmax whose row sum's terms
//! are kept for the store (the row scratch), a contraction whose epilogue
//! splits heads, an element-wise group with a gather, a convolution's taps
//! read in place, a concat along rows whose choice is made once per row, and a
//! whole input's reduction stored once for the larger program that reads it
//! (after the stored tensor it reduces, where it reduces one), a quantized
//! activation stored as its u8 codes, and a quantized residual block's sum in
//! its product's epilogue (reading the shortcut's codes), a static
//! quantization's column scales computed when lowering; and, in the GPU's
//! plans, a product's A
//! stored in bf16 by its producer, and a product read only by products
//! storing bf16.

fn lowered(text: &str) -> String {
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    let fusion = passes::fuse(&g);
    let plan = lower::lower(&g, &fusion).unwrap_or_else(|e| panic!("{e}"));
    plan::print_plan(&plan)
}

/// `text` lowered as the GPU's plans are, then `rewrite` (which must change
/// `changed` buffers): the plan's text.
fn lowered_for_gpu(text: &str, rewrite: fn(&mut plan::ModelPlan) -> usize, changed: usize) -> String {
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    let opts = lower::LowerOptions::gpu();
    let mut plan = lower::lower_with(&g, &passes::fuse(&g), &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rewrite(&mut plan), changed);
    plan::print_plan(&plan)
}

#[test]
fn layer_norm_is_one_stitch_program() {
    let got = lowered(
        r#"graph {
  sym n param 1..
  input %x: f32[n, 8]
  %m: f32[n, 1] = reduce_mean[axes=[1], keep_dims=true] %x
  %mb: f32[n, 8] = broadcast %m
  %d: f32[n, 8] = sub %x, %mb
  %sq: f32[n, 8] = mul %d, %d
  %v: f32[n, 1] = reduce_mean[axes=[1], keep_dims=true] %sq
  %r: f32[n, 1] = sqrt %v
  %rb: f32[n, 8] = broadcast %r
  %y: f32[n, 8] = div %d, %rb
  output %y
}
"#,
    );
    let want = r#"dims:
  d0 = 8*n
  d1 = n
buffers:
  b0: f32[n, 8] "x" (input 0)
  b1: f32[n, 8] "y" (output 0)
p0: program g0_stitch
  %0: in f32[d1, 8] "x"
  %1: out f32[d1, 8] "y"
  gpu: a thread per point (rows of 8, under a warp)
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for i0 < d1, i1 < 8:
    t0: f32 = sum(i2 < 8: %0[i0, i2])
    t1: f32 = cast<f32>(8)
    t2: f32 = div(t0, t1)
    t3: f32 = sub(%0[i0, i3], t2)
    t4: f32 = sum(i3 < 8: mul(t3, t3))
    %1[·] = div(sub(%0[i0, i1], t2), sqrt(div(t4, t1)))
group 0: stitch
  loop p0(b0, b1)
"#;
    assert_eq!(got, want, "got:\n{got}");
}

#[test]
fn merged_projection_splits_heads_in_its_epilogue() {
    let got = lowered(
        r#"graph {
  sym s param 1..
  input %x: f32[s, 4]
  %w: f32[4, 8] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
  %y: f32[s, 8] = matmul %x, %w
  %h: f32[s, 2, 4] = reshape %y
  %t: f32[2, s, 4] = transpose[perm=[1, 0, 2]] %h
  output %t
}
"#,
    );
    let want = r#"dims:
  d0 = 4*s
  d1 = 32
  d2 = 8*s
  d3 = 0
  d4 = 4
  d5 = 1
  d6 = 8
  d7 = s
buffers:
  b0: f32[s, 4] "x" (input 0)
  b1: f32[4, 8] "w" (constant)
  b2: f32[2, s, 4] "t" (output 0)
  b3: f32[s, 8] "y" (temp, steps 0..=1)
p0: program g0_contraction
  %0: in f32[d7, 8] "y"
  %1: out f32[2, d7, 4] "t"
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for i0 < 2, i1 < d7, i2 < 4:
    %1[·] = %0[i1, add(mul(i0, 4), i2)]
group 0: contraction
  matmul [] m d7 n d6 k d4 (weight): A b0+d3 strides [] d4 d5 · B b1+d3 strides [] d6 d5 → C b3+d3 strides [] d6 d5
  loop p0(b3, b2)
"#;
    assert_eq!(got, want, "got:\n{got}");
}

#[test]
fn a_broadcast_that_may_be_one_versions_its_program() {
    let got = lowered(
        r#"graph {
  sym n param 1..
  sym j param 1..
  assert j broadcasts to 8
  input %x: f32[n, 8]
  input %z: f32[n, j]
  %zb: f32[n, 8] = broadcast %z
  %y: f32[n, 8] = mul %x, %zb
  output %y
}
"#,
    );
    let want = r#"dims:
  d0 = 8*n
  d1 = j*n
  d2 = n
  d3 = j
buffers:
  b0: f32[n, 8] "x" (input 0)
  b1: f32[n, j] "z" (input 1)
  b2: f32[n, 8] "y" (output 0)
p0: program g0_elementwise
  %0: in f32[d2, 8] "x"
  %1: in f32[d2, d3] "z"
  %2: out f32[d2, 8] "y"
  versions on: equal(d3, 1)
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for i0 < d2, i1 < 8:
    %2[·] = mul(%0[i0, i1], %1[i0, select(equal(d3, 1), 0, i1)])
group 0: elementwise
  loop p0(b0, b1, b2)
"#;
    assert_eq!(got, want, "got:\n{got}");
}

/// A convolution's column matrix (two-by-two taps of a zero-padded
/// channels-last image, as `passes::conv` writes them) is read by the matmul in
/// place: no program stores the padded image or the taps.
#[test]
fn convolution_taps_are_read_from_the_image() {
    let got = lowered(
        r#"graph {
  sym h param 1..
  sym w param 1..
  input %x: f32[1, h, w, 16]
  input %k: f32[1, 64, 8]
  %p: f32[1, h+1, w+1, 16] = pad[pads=[(0, 0), (1, 0), (1, 0), (0, 0)], mode=constant(0)] %x
  %t0: f32[1, h, w, 16] = slice[1: 0 step 1, 2: 0 step 1] %p
  %t1: f32[1, h, w, 16] = slice[1: 0 step 1, 2: 1 step 1] %p
  %t2: f32[1, h, w, 16] = slice[1: 1 step 1, 2: 0 step 1] %p
  %t3: f32[1, h, w, 16] = slice[1: 1 step 1, 2: 1 step 1] %p
  %f0: f32[1, h, w, 1, 16] = reshape %t0
  %f1: f32[1, h, w, 1, 16] = reshape %t1
  %f2: f32[1, h, w, 1, 16] = reshape %t2
  %f3: f32[1, h, w, 1, 16] = reshape %t3
  %cat: f32[1, h, w, 4, 16] = concat[axis=3] %f0, %f1, %f2, %f3
  %col: f32[1, h*w, 64] = reshape %cat
  %y: f32[1, h*w, 8] = matmul %col, %k
  output %y
}
"#,
    );
    let want = r#"dims:
  d0 = 16*h*w
  d1 = 512
  d2 = 8*h*w
  d3 = 0
  d4 = 8
  d5 = 1
  d6 = h
  d7 = w
  d8 = 16
  d9 = 16*w
  d10 = h*w
  d11 = 64
buffers:
  b0: f32[1, h, w, 16] "x" (input 0)
  b1: f32[1, 64, 8] "k" (input 1)
  b2: f32[1, h*w, 8] "y" (output 0)
group 0: contraction
  matmul [d5] m d10 n d4 k d11: A taps b0+d3 image [d5, d6, d7, d8] strides [d0, d9, d8] out [d6, d7] kernel 2x2 stride 1x1 dilation 1x1 pad 1x1 · B b1+d3 strides [d1] d4 d5 → C b2+d3 strides [d2] d4 d5
"#;
    assert_eq!(got, want, "got:\n{got}");
}

/// The attention of `tests/attention.rs`, cut down: one fused step, and beside
/// the softmax program its online form over a chunk of keys (offset and length
/// in scratch slots of the dim table): the scores read at the chunk's key, the
/// mask at the key's place in the whole row, the logits stored, and
/// `exp(logits - max(running max, the chunk's max))`.
#[test]
fn attention_softmax_gets_an_online_form() {
    let got = lowered(ATTENTION);
    let want = r#"dims:
  d0 = 4*b*q
  d1 = 4*b*k
  d2 = b*k
  d3 = 1
  d4 = b*k*q
  d5 = 0
  d6 = 4*q
  d7 = 4
  d8 = 4*k
  d9 = k
  d10 = k*q
  d11 = b
  d12 = q
  d13 = the chunk's first key, set per chunk
  d14 = the chunk's keys, set per chunk
buffers:
  b0: f32[b, q, 4] "qs" (input 0)
  b1: f32[b, 4, k] "kt" (input 1)
  b2: f32[b, k, 4] "v" (input 2)
  b3: f32[b, 1, k] "mask" (input 3)
  b4: f32[1, 1, 1] "half" (constant)
  b5: f32[b, q, 4] "o" (output 0)
  b6: f32[b, q, k] "s" (temp, unused)
  b7: f32[b, q, k] "p" (temp, unused)
p0: program g0_attention
  %0: in f32[d11, d12, d9] "s"
  %1: in f32[d11, 1, d9] "mask"
  %2: out f32[d11, d12, d9] "p"
  gpu: a warp per row where d9 >= 32, else a thread per point
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned) where d9 % 4 == 0
  for i0 < d11, i1 < d12, i2 < d9:
    t0: f32 = max(i3 < d9: add(div(%0[i0, i1, i3], 2.0), %1[i0, 0, i3]))
    t1: f32 = sum(i4 < d9: exp(sub(add(div(%0[i0, i1, i4], 2.0), %1[i0, 0, i4]), t0)))
    %2[·] = div(exp(sub(add(div(%0[i0, i1, i2], 2.0), %1[i0, 0, i2]), t0)), t1)
  row scratch: t1's terms are kept in %2 and read back for exp(sub(add(div(%0[i0, i1, i2], 2.0), %1[i0, 0, i2]), t0))
p1: program g0_attention_online
  %0: in f32[d11, d12, d14] "s"
  %1: in f32[d11, 1, d9] "mask"
  %2: out f32[d11, d12, d14] "p"
  %3: in f32[d11, d12] "running max"
  %4: out f32[d11, d12, d14] "logits"
  gpu: a warp per row where d14 >= 32, else a thread per point
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned) where d14 % 4 == 0
  for i0 < d11, i1 < d12, i2 < d14:
    t0: f32 = add(div(%0[i0, i1, i2], 2.0), %1[i0, 0, add(d13, i2)])
    t1: f32 = max(i3 < d14: add(div(%0[i0, i1, i3], 2.0), %1[i0, 0, add(d13, i3)]))
    %4[·] = t0
    %2[·] = exp(sub(t0, max(%3[i0, i1], t1)))
group 0: attention
  attention, fused per block of query rows:
    scores = matmul [d11] m d12 n d9 k d7: A b0+d5 strides [d6] d7 d3 · B b1+d5 strides [d8] d9 d3 → C b6+d5 strides [d10] d9 d3
    probs = p0(scores, b3, probs)
    matmul [d11] m d12 n d7 k d9: A b7+d5 strides [d10] d9 d3 · B b2+d5 strides [d8] d7 d3 → C b5+d5 strides [d6] d7 d3
    long rows: keys in chunks (offset d13, length d14), online softmax p1
"#;
    assert_eq!(got, want, "got:\n{got}");
}

/// A softmax shifted by its row's minimum (`exp(x - min x) / sum`: the same
/// values, but no maximum for the recurrence to keep) is fused and keeps whole
/// rows.
#[test]
fn a_softmax_without_its_max_has_no_online_form() {
    let text = ATTENTION.replace("reduce_max", "reduce_min");
    let got = lowered(&text);
    assert!(got.contains("attention, fused per block of query rows"), "got:\n{got}");
    assert!(!got.contains("online softmax") && !got.contains("_online"), "got:\n{got}");
}

const ATTENTION: &str = r#"graph {
  sym b param 1..
  sym q param 1..
  sym k param 1..
  input %qs: f32[b, q, 4]
  input %kt: f32[b, 4, k]
  input %v: f32[b, k, 4]
  input %mask: f32[b, 1, k]
  %s: f32[b, q, k] = matmul %qs, %kt
  %half: f32[1, 1, 1] = constant [2.0]
  %hb: f32[b, q, k] = broadcast %half
  %ss: f32[b, q, k] = div %s, %hb
  %mb: f32[b, q, k] = broadcast %mask
  %sm: f32[b, q, k] = add %ss, %mb
  %mx: f32[b, q, 1] = reduce_max[axes=[2], keep_dims=true] %sm
  %mxb: f32[b, q, k] = broadcast %mx
  %sh: f32[b, q, k] = sub %sm, %mxb
  %ex: f32[b, q, k] = exp %sh
  %sum: f32[b, q, 1] = reduce_sum[axes=[2], keep_dims=true] %ex
  %sumb: f32[b, q, k] = broadcast %sum
  %p: f32[b, q, k] = div %ex, %sumb
  %o: f32[b, q, 4] = matmul %p, %v
  output %o
}
"#;

#[test]
fn a_concat_along_an_outer_axis_chooses_once_per_row() {
    let got = lowered(
        r#"graph {
  sym n param 1..
  input %a: f32[n, 8]
  input %b: f32[3, 8]
  %e: f32[n, 8] = exp %a
  %c: f32[n+3, 8] = concat[axis=0] %e, %b
  output %c
}
"#,
    );
    let want = r#"dims:
  d0 = 8*n
  d1 = 24
  d2 = 8*n+24
  d3 = n+3
  d4 = n
buffers:
  b0: f32[n, 8] "a" (input 0)
  b1: f32[3, 8] "b" (input 1)
  b2: f32[n+3, 8] "c" (output 0)
p0: program g0_elementwise
  %0: in f32[d4, 8] "a"
  %1: in f32[3, 8] "b"
  %2: out f32[d3, 8] "c"
  unswitched: the stored value's choice among 2 alternatives is made once per row
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for i0 < d3, i1 < 8:
    t0: bool = less(i0, d4)
    %2[·] = select(t0, exp(%0[i0, i1] if t0), %1[sub(i0, d4), i1] if less_eq(d4, i0))
group 0: elementwise
  loop p0(b0, b1, b2)
"#;
    assert_eq!(got, want, "got:\n{got}");
}

/// A pad's and a padded pool's loads are guarded by range checks affine in the
/// vectorized variable (the nest's innermost; the window's along a row):
/// `lower` records them as border guards, which the code generator tests at a
/// vector's two ends, with a masked load only at the borders.
#[test]
fn range_checked_loads_are_border_guards() {
    let got = lowered(
        r#"graph {
  sym n param 1..
  sym w param 1..
  input %x: f32[n, w]
  %p: f32[n, w+5] = pad[pads=[(0, 0), (2, 3)], mode=constant(0.5)] %x
  output %p
}
"#,
    );
    let want = r#"dims:
  d0 = n*w
  d1 = 5*n+n*w
  d2 = n
  d3 = w+5
  d4 = w
buffers:
  b0: f32[n, w] "x" (input 0)
  b1: f32[n, w+5] "p" (output 0)
p0: program g0_elementwise
  %0: in f32[d2, d4] "x"
  %1: out f32[d2, d3] "p"
  border: and(less_eq(0, sub(i1, 2)), less(sub(i1, 2), d4)) tested at a vector's two ends along i1: plain loads inside, masked at the border
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned) where d3 % 4 == 0
  for i0 < d2, i1 < d3:
    t0: i64 = sub(i1, 2)
    t1: bool = and(less_eq(0, t0), less(t0, d4))
    %1[·] = select(t1, %0[i0, t0] if t1, 0.5)
group 0: elementwise
  loop p0(b0, b1)
"#;
    assert_eq!(got, want, "got:\n{got}");
    let pool = lowered(
        r#"graph {
  sym h param 1..
  sym w param 1..
  input %img: f32[1, 2, h, w]
  %mp: f32[1, 2, h, w] = max_pool[kernel=[3, 3], strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1]] %img
  output %mp
}
"#,
    );
    let border = "  border: and(and(less_eq(0, sub(add(i1, i3), 1)), less(sub(add(i1, i3), 1), d1)), \
                  and(less_eq(0, sub(add(i2, i4), 1)), less(sub(add(i2, i4), 1), d2))) tested at a \
                  vector's two ends along i2, i4: plain loads inside, masked at the border\n";
    assert!(pool.contains(border), "the output's columns and the window's: got:\n{pool}");
}

/// A dynamic quantization: the whole input's range (two reductions to single
/// values) gives a scale that both a single output and the quantized tensor
/// read. The single values' program stores the scale once; the tensor's
/// program loads it instead of reducing the whole input again in each part.
#[test]
fn a_whole_input_scale_is_stored_once() {
    let got = lowered(
        r#"graph {
  sym n param 1..
  input %x: f32[n, 8]
  %hi: f32[] = reduce_max[axes=[0, 1], keep_dims=false] %x
  %lo: f32[] = reduce_min[axes=[0, 1], keep_dims=false] %x
  %w: f32[] = sub %hi, %lo
  %c: f32[] = constant 0.5
  %ws: f32[] = mul %w, %c
  %s1: f32[1, 1] = reshape %w
  %sb: f32[n, 8] = broadcast %s1
  %q: f32[n, 8] = div %x, %sb
  %r: f32[n, 8] = round %q
  output %ws, %r
}
"#,
    );
    let want = r#"dims:
  d0 = 8*n
  d1 = 1
  d2 = n
buffers:
  b0: f32[n, 8] "x" (input 0)
  b1: f32[] "c" (constant)
  b2: f32[] "ws" (output 0)
  b3: f32[n, 8] "r" (output 1)
  b4: f32[] "w" (temp, steps 0..=1)
p0: program g0_stitch
  %0: in f32[d2, 8] "x"
  %1: out f32[] "ws"
  %2: out f32[] "w"
  gpu: a thread per point (rows of 8, under a warp)
  for :
    t0: f32 = max(i0 < d2, i1 < 8: %0[i0, i1])
    t1: f32 = min(i2 < d2, i3 < 8: %0[i2, i3])
    t2: f32 = sub(t0, t1)
    %1[·] = mul(t2, 0.5)
    %2[·] = t2
p1: program g0_stitch_1
  %0: in f32[d2, 8] "x"
  %1: in f32[] "w"
  %2: out f32[d2, 8] "r"
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for i0 < d2, i1 < 8:
    %2[·] = round(div(%0[i0, i1], %1[]))
group 0: stitch
  loop p0(b0, b2, b4)
  loop p1(b0, b4, b3)
"#;
    assert_eq!(got, want, "got:\n{got}");
}

/// A dynamic quantization of a normalized tensor (BERT's layer norm, then
/// its quantization): the normalized rows are stored first, the whole range's
/// reductions read them back once, and the quantized tensor reads both.
#[test]
fn a_stored_tensor_is_reduced_after_it_is_stored() {
    let got = lowered(
        r#"graph {
  sym n param 1..
  input %x: f32[n, 8]
  %m: f32[n, 1] = reduce_mean[axes=[1], keep_dims=true] %x
  %mb: f32[n, 8] = broadcast %m
  %d: f32[n, 8] = sub %x, %mb
  %hi: f32[] = reduce_max[axes=[0, 1], keep_dims=false] %d
  %s1: f32[1, 1] = reshape %hi
  %sb: f32[n, 8] = broadcast %s1
  %q: f32[n, 8] = div %d, %sb
  %r: f32[n, 8] = round %q
  output %d, %r
}
"#,
    );
    let want = r#"dims:
  d0 = 8*n
  d1 = n
  d2 = 1
buffers:
  b0: f32[n, 8] "x" (input 0)
  b1: f32[n, 8] "d" (output 0)
  b2: f32[n, 8] "r" (output 1)
  b3: f32[] "hi" (temp, steps 1..=2)
p0: program g0_stitch
  %0: in f32[d1, 8] "x"
  %1: out f32[d1, 8] "d"
  gpu: a thread per point (rows of 8, under a warp)
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for i0 < d1, i1 < 8:
    t0: f32 = sum(i2 < 8: %0[i0, i2])
    %1[·] = sub(%0[i0, i1], div(t0, cast<f32>(8)))
p1: program g0_stitch_1
  %0: in f32[d1, 8] "d"
  %1: out f32[] "hi"
  one point's reduction splits over threads along i1 < 8
  gpu: a thread per point (rows of 8, under a warp)
  for :
    t0: f32 = max(i0 < d1, i1 < 8: %0[i0, i1])
    %1[·] = t0
p2: program g0_stitch_2
  %0: in f32[d1, 8] "d"
  %1: in f32[] "hi"
  %2: out f32[d1, 8] "r"
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for i0 < d1, i1 < 8:
    %2[·] = round(div(%0[i0, i1], %1[]))
group 0: stitch
  loop p0(b0, b1)
  loop p1(b1, b3)
  loop p2(b1, b3, b2)
"#;
    assert_eq!(got, want, "got:\n{got}");
}

/// A channels-last product's rows read back as an NCHW image (ResNet's output):
/// `[1, n·h·w, 4]` at `[n, h, w, 4]` is the linear position itself, with no
/// division or remainder per element (the unit axis is at 0, the row whole).
#[test]
fn rows_read_as_an_image_need_no_division() {
    let got = lowered(
        r#"graph {
  sym n param 1..
  sym h param 1..
  sym w param 1..
  input %x: f32[1, n*h*w, 4]
  %r: f32[n, h, w, 4] = reshape %x
  %t: f32[n, 4, h, w] = transpose[perm=[0, 3, 1, 2]] %r
  %y: f32[n, 4, h, w] = relu %t
  output %y
}
"#,
    );
    assert!(!got.contains("div(") && !got.contains("mod("), "got:\n{got}");
    assert!(got.contains("%0[0, add(mul(add(mul(i0, "), "got:\n{got}");
}

/// A quantized activation (`cast<f32>` of u8 codes) that a loop program
/// writes and a product by a constant reads as its A is stored as its codes
/// (`LowerOptions::u8_codes`): the buffer is `u8`, the program stores the codes
/// and the element-wise reader loads them widened. Without the option (the
/// GPU's plans) it is stored as f32.
#[test]
fn a_quantized_activation_is_stored_as_codes() {
    let text = r#"graph {
  sym n param 1..
  input %x: f32[n, 8]
  %w: f32[8, 4] = constant [-3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1]
  %r: f32[n, 8] = round %x
  %i: i32[n, 8] = cast %r
  %q: u8[n, 8] = cast %i
  %qf: f32[n, 8] = cast %q
  %y: f32[n, 4] = matmul %qf, %w
  %e: f32[n, 8] = sqrt %qf
  output %y, %e
}
"#;
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    let fusion = passes::fuse(&g);
    let with = |u8_codes: bool| {
        let opts = lower::LowerOptions { u8_codes, ..Default::default() };
        plan::print_plan(&lower::lower_with(&g, &fusion, &opts).unwrap_or_else(|e| panic!("{e}")))
    };
    let got = with(true);
    let want = r#"dims:
  d0 = 8*n
  d1 = 32
  d2 = 4*n
  d3 = n
  d4 = 0
  d5 = 8
  d6 = 1
  d7 = 4
buffers:
  b0: f32[n, 8] "x" (input 0)
  b1: f32[8, 4] "w" (constant)
  b2: f32[n, 4] "y" (output 0)
  b3: f32[n, 8] "e" (output 1)
  b4: u8[n, 8] "qf" (temp, steps 0..=1)
p0: program g0_elementwise
  %0: in f32[d3, 8] "x"
  %1: out u8[d3, 8] "qf"
  %2: out f32[d3, 8] "e"
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for i0 < d3, i1 < 8:
    t0: u8 = cast<u8>(cast<i32>(round(%0[i0, i1])))
    %1[·] = t0
    %2[·] = sqrt(cast<f32>(t0))
group 0: elementwise
  loop p0(b0, b4, b3)
group 1: contraction
  matmul [] m d3 n d7 k d5 (weight) (u8·s8): A b4+d4 strides [] d5 d6 · B b1+d4 strides [] d7 d6 → C b2+d4 strides [] d7 d6
"#;
    assert_eq!(got, want, "got:\n{got}");
    let floats = with(false);
    assert!(floats.contains("b4: f32[n, 8] \"qf\"") && !floats.contains("u8[n, 8]"), "{floats}");
}

/// A product by a constant whose epilogue quantizes (its values integers in
/// 0..=255) and whose only reader is the A of another such product stores its
/// C as codes where one K block takes its depth (`LowerOptions::codes_depth`):
/// the buffer is `u8` and the epilogue says so. Deeper than the block, or
/// without the option, C stays f32.
#[test]
fn a_quantizing_products_output_is_stored_as_codes() {
    let text = r#"graph {
  sym n param 1..
  input %x: f32[n, 8]
  %w: f32[8, 4] = constant [-3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1]
  %v: f32[4, 2] = constant [1, -1, 2, -2, 3, -3, 4, -4]
  %r: f32[n, 8] = round %x
  %i: i32[n, 8] = cast %r
  %q: u8[n, 8] = cast %i
  %qf: f32[n, 8] = cast %q
  %y: f32[n, 4] = matmul %qf, %w
  %s: f32[1, 1] = constant [0.25]
  %sb: f32[n, 4] = broadcast %s
  %ys: f32[n, 4] = mul %y, %sb
  %yr: f32[n, 4] = round %ys
  %yi: i32[n, 4] = cast %yr
  %lo: i32[1, 1] = constant [0]
  %lob: i32[n, 4] = broadcast %lo
  %hi: i32[1, 1] = constant [255]
  %hib: i32[n, 4] = broadcast %hi
  %c0: i32[n, 4] = max %yi, %lob
  %c1: i32[n, 4] = min %c0, %hib
  %yq: u8[n, 4] = cast %c1
  %yf: f32[n, 4] = cast %yq
  %z: f32[n, 2] = matmul %yf, %v
  output %z
}
"#;
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    let fusion = passes::fuse(&g);
    let with = |u8_codes: bool, rows: usize| {
        let opts = lower::LowerOptions { u8_codes, codes_depth: rows, ..Default::default() };
        plan::print_plan(&lower::lower_with(&g, &fusion, &opts).unwrap_or_else(|e| panic!("{e}")))
    };
    let got = with(true, 8);
    let want = r#"dims:
  d0 = 8*n
  d1 = 32
  d2 = 8
  d3 = 1
  d4 = 2*n
  d5 = 4*n
  d6 = n
  d7 = 0
  d8 = 4
  d9 = 2
buffers:
  b0: f32[n, 8] "x" (input 0)
  b1: f32[8, 4] "w" (constant)
  b2: f32[4, 2] "v" (constant)
  b3: f32[1, 1] "s" (constant)
  b4: i32[1, 1] "lo" (constant)
  b5: i32[1, 1] "hi" (constant)
  b6: f32[n, 2] "z" (output 0)
  b7: u8[n, 8] "qf" (temp, steps 0..=1)
  b8: u8[n, 4] "yf" (temp, steps 1..=2)
  b9: f32[n, 4] "y" (temp, unused)
p0: program g0_elementwise
  %0: in f32[d6, 8] "x"
  %1: out u8[d6, 8] "qf"
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for i0 < d6, i1 < 8:
    %1[·] = cast<u8>(cast<i32>(round(%0[i0, i1])))
group 0: elementwise
  loop p0(b0, b7)
group 1: contraction
  matmul [] m d6 n d8 k d2 (weight) (u8·s8): A b7+d7 strides [] d2 d3 · B b1+d7 strides [] d8 d3 → C b8+d7 strides [] d8 d3, epilogue integer(round(mul(x, p0)), 0, 0..=255) with 0.25, stored as u8 codes
group 2: contraction
  matmul [] m d6 n d9 k d8 (weight) (u8·s8): A b8+d7 strides [] d8 d3 · B b2+d7 strides [] d9 d3 → C b6+d7 strides [] d9 d3
"#;
    assert_eq!(got, want, "got:\n{got}");
    for floats in [with(true, 7), with(false, 8)] {
        assert!(!floats.contains("stored as u8 codes") && floats.contains("f32[n, 4] \"yf\""), "{floats}");
    }
}

/// A quantized residual block: a product's requantized output, dequantized,
/// plus a dequantized shortcut of u8 codes, quantized again and read by the
/// next product. The sum is the first product's epilogue program, reading
/// the shortcut's codes as its residual and storing codes: no loop program
/// is left between the products. Its value before the last rounding,
/// `((q - 3)·0.5 + r·0.25) / 0.5`, is computed in two multiply-adds, `q·1 +
/// (r·0.5 - 3)`, which rounds to the same code for every pair of codes. The GPU's plans keep the sum in a program
/// (`LowerOptions::residual_programs`).
#[test]
fn a_quantized_residual_sum_is_the_products_epilogue() {
    let text = r#"graph {
  sym n param 1..
  input %x: u8[n, 8]
  input %r: u8[n, 4]
  %w: f32[8, 4] = constant [-3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1]
  %v: f32[4, 2] = constant [1, -1, 2, -2, 3, -3, 4, -4]
  %qf: f32[n, 8] = cast %x
  %y: f32[n, 4] = matmul %qf, %w
  %s: f32[1, 1] = constant [0.25]
  %sb: f32[n, 4] = broadcast %s
  %ys: f32[n, 4] = mul %y, %sb
  %yr: f32[n, 4] = round %ys
  %yi: i32[n, 4] = cast %yr
  %z3: i32[1, 1] = constant [3]
  %z3b: i32[n, 4] = broadcast %z3
  %yz: i32[n, 4] = add %yi, %z3b
  %lo: i32[1, 1] = constant [0]
  %lob: i32[n, 4] = broadcast %lo
  %hi: i32[1, 1] = constant [255]
  %hib: i32[n, 4] = broadcast %hi
  %c0: i32[n, 4] = max %yz, %lob
  %c1: i32[n, 4] = min %c0, %hib
  %yq: u8[n, 4] = cast %c1
  %yf: f32[n, 4] = cast %yq
  %f3: f32[1, 1] = constant [3]
  %f3b: f32[n, 4] = broadcast %f3
  %yd0: f32[n, 4] = sub %yf, %f3b
  %h: f32[1, 1] = constant [0.5]
  %hb: f32[n, 4] = broadcast %h
  %yd: f32[n, 4] = mul %yd0, %hb
  %rf: f32[n, 4] = cast %r
  %rd: f32[n, 4] = mul %rf, %sb
  %sum: f32[n, 4] = add %yd, %rd
  %o: f32[n, 4] = div %sum, %hb
  %or: f32[n, 4] = round %o
  %oi: i32[n, 4] = cast %or
  %o0: i32[n, 4] = max %oi, %lob
  %o1: i32[n, 4] = min %o0, %hib
  %oq: u8[n, 4] = cast %o1
  %of: f32[n, 4] = cast %oq
  %z: f32[n, 2] = matmul %of, %v
  output %z
}
"#;
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    let fusion = passes::fuse(&g);
    let with = |opts: lower::LowerOptions| {
        plan::print_plan(&lower::lower_with(&g, &fusion, &opts).unwrap_or_else(|e| panic!("{e}")))
    };
    let got = with(lower::LowerOptions { codes_depth: 8, ..Default::default() });
    let want = r#"dims:
  d0 = 8*n
  d1 = 4*n
  d2 = 32
  d3 = 8
  d4 = 1
  d5 = 2*n
  d6 = 0
  d7 = 4
  d8 = n
  d9 = 2
buffers:
  b0: u8[n, 8] "x" (input 0)
  b1: u8[n, 4] "r" (input 1)
  b2: f32[8, 4] "w" (constant)
  b3: f32[4, 2] "v" (constant)
  b4: f32[1, 1] "s" (constant)
  b5: i32[1, 1] "z3" (constant)
  b6: i32[1, 1] "lo" (constant)
  b7: i32[1, 1] "hi" (constant)
  b8: f32[1, 1] "f3" (constant)
  b9: f32[1, 1] "h" (constant)
  b10: f32[n, 2] "z" (output 0)
  b11: u8[n, 4] "of" (temp, steps 0..=1)
  b12: f32[n, 4] "y" (temp, unused)
group 0: contraction
  matmul [] m d8 n d7 k d3 (weight) (u8·s8): A b0+d6 strides [] d3 d4 · B b2+d6 strides [] d7 d4 → C b11+d6 strides [] d7 d4, epilogue scale 0.25 + integer(round(mul_add(integer(round(x), 3, 0..=255), p2, mul_add(residual, p1, p0))), 0, 0..=255) with -3.0, 0.5, 1.0, reading residual b1 (u8 codes), stored as u8 codes
group 1: contraction
  matmul [] m d8 n d9 k d7 (weight) (u8·s8): A b11+d6 strides [] d7 d4 · B b3+d6 strides [] d9 d4 → C b10+d6 strides [] d9 d4
"#;
    assert_eq!(got, want, "got:\n{got}");
    // Where the product cannot store codes (deeper than one K block), its C
    // holds the sum's values as floats.
    let floats = with(lower::LowerOptions { codes_depth: 7, ..Default::default() });
    let fused = "reading residual b1 (u8 codes)\n";
    assert!(floats.contains(fused) && floats.contains("b11: f32[n, 4] \"of\""), "{floats}");
    // The GPU's plans keep the sum in a loop program reading the shortcut.
    let gpu = with(lower::LowerOptions::gpu());
    assert!(!gpu.contains("reading residual") && gpu.contains("loop p1(b13, b1, b11)"), "{gpu}");
}

/// A statically quantized product's column scales (a weight scale per output
/// channel over the output's scale) and zero point sums are constants, so they
/// are computed once when the model is lowered, each value as the program's
/// f32 operations give it (a quotient correctly rounded), and no program runs
/// for them at a call; where a scale is known only per call (an input here, a
/// dynamic quantization's in a model) a program over the columns computes them.
#[test]
fn a_static_quantizations_column_terms_are_constants() {
    let graph = |scale: &str| {
        format!(
            r#"graph {{
  sym n param 1..
  input %x: u8[n, 8]
  {scale}
  %w: f32[8, 4] = constant [-3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1, 2, -2, 1, -3, 0, 3, -1]
  %xf: f32[n, 8] = cast %x
  %y: f32[n, 4] = matmul %xf, %w
  %sw: f32[1, 4] = constant [0.1, 0.2, 0.3, 0.7]
  %swb: f32[n, 4] = broadcast %sw
  %ys: f32[n, 4] = mul %y, %swb
  %bias: f32[1, 4] = constant [0.5, -1.25, 3, 0.1]
  %biasb: f32[n, 4] = broadcast %bias
  %yb: f32[n, 4] = add %ys, %biasb
  %sb: f32[n, 4] = broadcast %s
  %yo: f32[n, 4] = div %yb, %sb
  %yr: f32[n, 4] = round %yo
  %yi: i32[n, 4] = cast %yr
  %lo: i32[1, 1] = constant [0]
  %lob: i32[n, 4] = broadcast %lo
  %hi: i32[1, 1] = constant [255]
  %hib: i32[n, 4] = broadcast %hi
  %c0: i32[n, 4] = max %yi, %lob
  %c1: i32[n, 4] = min %c0, %hib
  %yq: u8[n, 4] = cast %c1
  %o: f32[n, 4] = cast %yq
  output %o
}}
"#
        )
    };
    let lower = |text: &str| {
        let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
        lower::lower(&g, &passes::fuse(&g)).unwrap_or_else(|e| panic!("{e}"))
    };
    let plan = lower(&graph("%s: f32[1, 1] = constant [0.3]"));
    let got = plan::print_plan(&plan);
    let product = got.lines().find(|l| l.contains("matmul")).unwrap_or_else(|| panic!("{got}"));
    assert!(!got.contains("program") && !got.contains("loop "), "no program runs:\n{got}");
    assert!(product.contains("epilogue column scale b") && product.contains(" + bias b"), "{got}");
    // The values, bit for bit: `(1·sw[c]) / s` and `bias[c] / s`.
    let values = |name: &str| -> Vec<u32> {
        let b =
            plan.buffers.iter().find(|b| b.name.ends_with(name)).unwrap_or_else(|| panic!("{name}:\n{got}"));
        let plan::BufferKind::Constant(c) = &b.kind else { panic!("{name} is not a constant:\n{got}") };
        c.to_tensor().to_f64_vec().iter().map(|v| (*v as f32).to_bits()).collect()
    };
    let (sw, s) = ([0.1f32, 0.2, 0.3, 0.7], 0.3f32);
    let want: Vec<u32> = sw.iter().map(|w| ((1.0 * w) / s).to_bits()).collect();
    assert_eq!(values(".column scales"), want, "{got}");
    let want: Vec<u32> = [0.5f32, -1.25, 3.0, 0.1].iter().map(|b| (b / s).to_bits()).collect();
    assert_eq!(values(".column bias"), want, "{got}");
    // A scale given per call: a program over the columns computes both terms.
    let per_call = plan::print_plan(&lower(&graph("input %s: f32[1, 1]")));
    assert!(per_call.contains("program g0_columns") && per_call.contains("column scale b"), "{per_call}");
}

/// The GPU's plans: a program whose output a contraction reads as its A
/// also stores it as bf16 (`lower::bf16_operands`), and the product names
/// that buffer. Two steps share the tanh program but only one feeds a
/// product: that one takes a copy of the program with the second store;
/// the other keeps the original. A product of an input keeps its A.
#[test]
fn a_products_producer_stores_its_a_in_bf16() {
    let got = lowered_for_gpu(
        r#"graph {
  sym n param 1..
  input %x: f32[n, 8]
  input %y: f32[n, 8]
  input %w: f32[8, 16]
  %t: f32[n, 8] = tanh %x
  %c: f32[n, 16] = matmul %t, %w
  %u: f32[n, 8] = tanh %y
  %d: f32[n, 16] = matmul %x, %w
  output %c, %u, %d
}
"#,
        lower::bf16_operands,
        1,
    );
    let want = r#"dims:
  d0 = 8*n
  d1 = 128
  d2 = 16*n
  d3 = n
  d4 = 0
  d5 = 8
  d6 = 1
  d7 = 16
buffers:
  b0: f32[n, 8] "x" (input 0)
  b1: f32[n, 8] "y" (input 1)
  b2: f32[8, 16] "w" (input 2)
  b3: f32[n, 16] "c" (output 0)
  b4: f32[n, 8] "u" (output 1)
  b5: f32[n, 16] "d" (output 2)
  b6: f32[n, 8] "t" (temp, steps 0..=1)
  b7: bf16[n, 8] "t.bf16" (temp, steps 0..=1)
p0: program g0_elementwise
  %0: in f32[d3, 8] "x"
  %1: out f32[d3, 8] "t"
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for i0 < d3, i1 < 8:
    %1[·] = tanh(%0[i0, i1])
p1: program g0_elementwise_bf16
  %0: in f32[d3, 8] "x"
  %1: out f32[d3, 8] "t"
  %2: out bf16[d3, 8] "t_bf16"
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for i0 < d3, i1 < 8:
    t0: f32 = tanh(%0[i0, i1])
    %1[·] = t0
    %2[·] = cast<bf16>(t0)
group 0: elementwise
  loop p1(b0, b6, b7)
group 1: contraction
  matmul [] m d3 n d7 k d5: A b6+d4 strides [] d5 d6 (as bf16 in b7) · B b2+d4 strides [] d7 d6 → C b3+d4 strides [] d7 d6
group 2: elementwise
  loop p0(b1, b4)
group 3: contraction
  matmul [] m d3 n d7 k d5: A b0+d4 strides [] d5 d6 · B b2+d4 strides [] d7 d6 → C b5+d4 strides [] d7 d6
"#;
    assert_eq!(got, want, "got:\n{got}");
}

/// The GPU's plans: a product whose output only another product reads, as
/// its A, stores it in bf16 (`lower::bf16_products`): the buffer is bf16 and
/// the step's bias a bf16 constant. A product adding a residual keeps f32.
#[test]
fn a_product_read_only_by_products_stores_bf16() {
    let list = |n: usize| (0..n).map(|i| format!("{}", (i % 7) as f32 / 4.0)).collect::<Vec<_>>().join(", ");
    let text = format!(
        r#"graph {{
  sym n param 1..
  input %x: f32[n, 8]
  input %r: f32[n, 16]
  %w: f32[8, 16] = constant [{}]
  %b: f32[1, 16] = constant [{}]
  %v: f32[16, 8] = constant [{}]
  %y: f32[n, 16] = matmul %x, %w
  %bb: f32[n, 16] = broadcast %b
  %h: f32[n, 16] = add %y, %bb
  %o: f32[n, 8] = matmul %h, %v
  %y2: f32[n, 16] = matmul %x, %w
  %res: f32[n, 16] = add %y2, %r
  %o2: f32[n, 8] = matmul %res, %v
  output %o, %o2
}}
"#,
        list(128),
        list(16),
        list(128)
    );
    let got = lowered_for_gpu(&text, lower::bf16_products, 1);
    let want = r#"dims:
  d0 = 8*n
  d1 = 16*n
  d2 = 128
  d3 = 16
  d4 = 0
  d5 = 8
  d6 = 1
  d7 = n
buffers:
  b0: f32[n, 8] "x" (input 0)
  b1: f32[n, 16] "r" (input 1)
  b2: f32[8, 16] "w" (constant)
  b3: f32[1, 16] "b" (constant)
  b4: f32[16, 8] "v" (constant)
  b5: f32[n, 8] "o" (output 0)
  b6: f32[n, 8] "o2" (output 1)
  b7: bf16[n, 16] "h" (temp, steps 0..=1)
  b8: f32[n, 16] "res" (temp, steps 2..=3)
  b9: f32[n, 16] "y" (temp, unused)
  b10: f32[n, 16] "y2" (temp, unused)
  b11: bf16[1, 16] "b.bf16" (constant)
group 0: contraction
  matmul [] m d7 n d3 k d5 (weight): A b0+d4 strides [] d5 d6 · B b2+d4 strides [] d3 d6 → C b7+d4 strides [] d3 d6, epilogue bias b11
group 1: contraction
  matmul [] m d7 n d5 k d3 (weight): A b7+d4 strides [] d3 d6 · B b4+d4 strides [] d5 d6 → C b5+d4 strides [] d5 d6
group 2: contraction
  matmul [] m d7 n d3 k d5 (weight): A b0+d4 strides [] d5 d6 · B b2+d4 strides [] d3 d6 → C b8+d4 strides [] d3 d6, epilogue residual b1
group 3: contraction
  matmul [] m d7 n d5 k d3 (weight): A b8+d4 strides [] d3 d6 · B b4+d4 strides [] d5 d6 → C b6+d4 strides [] d5 d6
"#;
    assert_eq!(got, want, "got:\n{got}");
}

/// The 2×2 convolution of `convolution_taps_are_read_from_the_image` over an
/// image that a loop program writes (`tanh`), `c` channels.
fn convolution_over_a_program(c: usize) -> String {
    let k = 4 * c;
    format!(
        r#"graph {{
  sym h param 1..
  sym w param 1..
  input %x0: f32[1, h, w, {c}]
  input %k: f32[1, {k}, 8]
  %x: f32[1, h, w, {c}] = tanh %x0
  %p: f32[1, h+1, w+1, {c}] = pad[pads=[(0, 0), (1, 0), (1, 0), (0, 0)], mode=constant(0)] %x
  %t0: f32[1, h, w, {c}] = slice[1: 0 step 1, 2: 0 step 1] %p
  %t1: f32[1, h, w, {c}] = slice[1: 0 step 1, 2: 1 step 1] %p
  %t2: f32[1, h, w, {c}] = slice[1: 1 step 1, 2: 0 step 1] %p
  %t3: f32[1, h, w, {c}] = slice[1: 1 step 1, 2: 1 step 1] %p
  %f0: f32[1, h, w, 1, {c}] = reshape %t0
  %f1: f32[1, h, w, 1, {c}] = reshape %t1
  %f2: f32[1, h, w, 1, {c}] = reshape %t2
  %f3: f32[1, h, w, 1, {c}] = reshape %t3
  %cat: f32[1, h, w, 4, {c}] = concat[axis=3] %f0, %f1, %f2, %f3
  %col: f32[1, h*w, {k}] = reshape %cat
  %y: f32[1, h*w, 8] = matmul %col, %k
  output %y
}}
"#
    )
}

/// The GPU's plans: a convolution whose image a loop program writes, its
/// channels a multiple of 8, gets the image in bf16 beside the f32 one
/// (`lower::bf16_operands`), which the taps kernels read in place; with 12
/// channels (a 16-byte chunk would straddle two taps) it does not.
#[test]
fn a_convolutions_image_is_written_in_bf16_for_its_taps() {
    let got = lowered_for_gpu(&convolution_over_a_program(16), lower::bf16_operands, 1);
    let want = r#"dims:
  d0 = 16*h*w
  d1 = 512
  d2 = 8*h*w
  d3 = h
  d4 = w
  d5 = 0
  d6 = 8
  d7 = 1
  d8 = 16
  d9 = 16*w
  d10 = h*w
  d11 = 64
buffers:
  b0: f32[1, h, w, 16] "x0" (input 0)
  b1: f32[1, 64, 8] "k" (input 1)
  b2: f32[1, h*w, 8] "y" (output 0)
  b3: f32[1, h, w, 16] "x" (temp, steps 0..=1)
  b4: bf16[1, h, w, 16] "x.bf16" (temp, steps 0..=1)
p0: program g0_elementwise_bf16
  %0: in f32[1, d3, d4, 16] "x0"
  %1: out f32[1, d3, d4, 16] "x"
  %2: out bf16[1, d3, d4, 16] "x_bf16"
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for 0 < 1, i0 < d3, i1 < d4, i2 < 16:
    t0: f32 = tanh(%0[0, i0, i1, i2])
    %1[·] = t0
    %2[·] = cast<bf16>(t0)
group 0: elementwise
  loop p0(b0, b3, b4)
group 1: contraction
  matmul [d7] m d10 n d6 k d11: A taps b3+d5 image [d7, d3, d4, d8] strides [d0, d9, d8] out [d3, d4] kernel 2x2 stride 1x1 dilation 1x1 pad 1x1 (image as bf16 in b4) · B b1+d5 strides [d1] d6 d7 → C b2+d5 strides [d2] d6 d7
"#;
    assert_eq!(got, want, "got:\n{got}");
    lowered_for_gpu(&convolution_over_a_program(12), lower::bf16_operands, 0);
}

/// The GPU's plans: a product's f32 output that a loop reads and another
/// product takes as its A gets a bf16 copy that the first product's
/// epilogue stores beside it (`MatMulStep::c_bf16`), the second reading it.
#[test]
fn a_products_output_read_by_a_product_and_a_loop_is_stored_twice() {
    let list = |n: usize| (0..n).map(|i| format!("{}", (i % 7) as f32 / 4.0)).collect::<Vec<_>>().join(", ");
    let text = format!(
        r#"graph {{
  sym n param 1..
  input %x: f32[n, 8]
  %w: f32[8, 16] = constant [{}]
  %v: f32[16, 8] = constant [{}]
  %h: f32[n, 16] = matmul %x, %w
  %o: f32[n, 8] = matmul %h, %v
  %t: f32[n, 16] = tanh %h
  output %o, %t
}}
"#,
        list(128),
        list(128)
    );
    let got = lowered_for_gpu(&text, lower::bf16_operands, 1);
    let want = r#"dims:
  d0 = 8*n
  d1 = 128
  d2 = 16*n
  d3 = 0
  d4 = 8
  d5 = 1
  d6 = 16
  d7 = n
buffers:
  b0: f32[n, 8] "x" (input 0)
  b1: f32[8, 16] "w" (constant)
  b2: f32[16, 8] "v" (constant)
  b3: f32[n, 8] "o" (output 0)
  b4: f32[n, 16] "t" (output 1)
  b5: f32[n, 16] "h" (temp, steps 0..=2)
  b6: bf16[n, 16] "h.bf16" (temp, steps 0..=1)
p0: program g2_elementwise
  %0: in f32[d7, 16] "h"
  %1: out f32[d7, 16] "t"
  gpu: quads (4 adjacent points a thread or lane, vector accesses where aligned)
  for i0 < d7, i1 < 16:
    %1[·] = tanh(%0[i0, i1])
group 0: contraction
  matmul [] m d7 n d6 k d4 (weight): A b0+d3 strides [] d4 d5 · B b1+d3 strides [] d6 d5 → C b5+d3 strides [] d6 d5 (also as bf16 in b6)
group 1: contraction
  matmul [] m d7 n d4 k d6 (weight): A b5+d3 strides [] d6 d5 (as bf16 in b6) · B b2+d3 strides [] d4 d5 → C b3+d3 strides [] d4 d5
group 2: elementwise
  loop p0(b5, b4)
"#;
    assert_eq!(got, want, "got:\n{got}");
}

/// The GPU's plans: a layer norm and an RMS norm (as the import splits them)
/// whose outputs one weight's product alone reads are named in the product
/// (`lower::normalized_operands`: its normalizing GEMVs read the norm's
/// input and the norm's step is skipped); a norm whose output is also the
/// model's output is not.
#[test]
fn a_products_row_norm_is_named_in_it() {
    let list = |n: usize| (0..n).map(|i| format!("{}", (i % 7) as f32 / 4.0)).collect::<Vec<_>>().join(", ");
    // `y` = the norm of `x`: centered (a layer norm) or not (an RMS norm).
    let norm = |x: &str, y: &str, centered: bool| {
        let (lines, d) = if centered {
            (
                format!(
                    "  %{y}m: f32[n, 1] = reduce_mean[axes=[1], keep_dims=true] %{x}
  %{y}mb: f32[n, 8] = broadcast %{y}m
  %{y}d: f32[n, 8] = sub %{x}, %{y}mb
"
                ),
                format!("%{y}d"),
            )
        } else {
            (String::new(), format!("%{x}"))
        };
        format!(
            "{lines}  %{y}sq: f32[n, 8] = mul {d}, {d}
  %{y}v: f32[n, 1] = reduce_mean[axes=[1], keep_dims=true] %{y}sq
  %{y}e: f32[1, 1] = constant [0.00001]
  %{y}eb: f32[n, 1] = broadcast %{y}e
  %{y}ve: f32[n, 1] = add %{y}v, %{y}eb
  %{y}r: f32[n, 1] = sqrt %{y}ve
  %{y}ri: f32[n, 1] = reciprocal %{y}r
  %{y}rb: f32[n, 8] = broadcast %{y}ri
  %{y}: f32[n, 8] = mul {d}, %{y}rb
"
        )
    };
    let text = format!(
        "graph {{
  sym n param 1..
  input %x: f32[n, 8]
  input %z: f32[n, 8]
  input %u: f32[n, 8]
  %w: f32[8, 16] = constant [{}]
{}{}{}  %o1: f32[n, 16] = matmul %a, %w
  %o2: f32[n, 16] = matmul %b, %w
  %o3: f32[n, 16] = matmul %c, %w
  output %o1, %o2, %o3, %c
}}
",
        list(128),
        norm("x", "a", true),
        norm("z", "b", false),
        norm("u", "c", true),
    );
    let got = lowered_for_gpu(&text, lower::normalized_operands, 2);
    let named: Vec<&str> = got.lines().filter(|l| l.contains("which a normalizing GEMV skips")).collect();
    assert_eq!(named.len(), 2, "{got}");
    assert!(named[0].contains("(layer norm of b0 by step "), "{got}");
    assert!(named[1].contains("(RMS norm of b1 by step "), "{got}");
}

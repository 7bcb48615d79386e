//! The plain definition of a convolution's taps, which the operand copy
//! (`tests/operand_copy.rs`) and the taps kernels (`tests/nvptx_steps.rs`)
//! are both tested against.

use plan::gpu::OperandCopy;

/// `copy`'s taps over `image` (from element `start`) as the column matrix:
/// row `(b, y, x)`, column `(i, j, c)`, `zero` outside the image.
pub fn column_matrix<T: Copy>(image: &[T], start: usize, copy: &OperandCopy, zero: T) -> Vec<T> {
    let &OperandCopy::Taps {
        rows,
        cols,
        out: [oh, ow],
        image: [h, w, channels],
        kernel_width: kw,
        stride: [sh, sw],
        dilation: [dh, dw],
        pad: [ph, pw],
        strides: [s_img, s_row, s_pix],
    } = copy
    else {
        panic!("not taps: {copy:?}")
    };
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let (b, y, x) = (r / (oh * ow), r / ow % oh, r % ow);
        for d in 0..cols {
            let (tap, c) = (d / channels, d % channels);
            let (i, j) = (tap / kw, tap % kw);
            let iy = (y * sh + i * dh) as isize - ph as isize;
            let ix = (x * sw + j * dw) as isize - pw as isize;
            let inside = (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix);
            out.push(if inside {
                image[start + b * s_img + iy as usize * s_row + ix as usize * s_pix + c]
            } else {
                zero
            });
        }
    }
    out
}

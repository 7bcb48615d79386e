//! Binding a call's input tensors to a model's symbolic input types: shared by
//! the reference interpreter and the runtime of compiled models, so that both
//! accept and reject exactly the same inputs with the same messages.

use sym::{Bindings, DimFact, ShapeEnv, SymError};

use crate::{DType, TensorData, TensorType};

/// What is wrong with the inputs of a call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InputError {
    #[error("missing input '{name}' (the model's inputs are: {expected})")]
    Missing { name: String, expected: String },
    #[error("unknown input '{name}' (the model's inputs are: {expected})")]
    Unknown { name: String, expected: String },
    #[error("input '{0}' is given more than once")]
    Duplicate(String),
    #[error("input '{name}' must be {expected} ({ty}), got {got}")]
    DType { name: String, expected: DType, ty: String, got: DType },
    #[error("input '{name}' must have rank {rank} ({ty}), got shape {got:?}")]
    Rank { name: String, rank: usize, ty: String, got: Vec<usize> },
    /// An input shape breaks a fact of the `ShapeEnv` (the message names the input, the dim and the rule).
    #[error("input shapes do not fit the model: {0}")]
    Binding(SymError),
}

/// Check `inputs` against the model's `expected` inputs and bind the symbols:
/// every input given exactly once, with its dtype and rank; the dims then go to
/// [`ShapeEnv::bind`], which checks every recorded shape fact. Returns the
/// bindings and every input dim in order (the call's shape signature).
pub fn bind_inputs<T: TensorData>(
    env: &ShapeEnv,
    expected: &[(&str, &TensorType)],
    inputs: &[(&str, T)],
) -> Result<(Bindings, Vec<i64>), InputError> {
    let names = || expected.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
    for (i, (name, _)) in inputs.iter().enumerate() {
        if !expected.iter().any(|(n, _)| n == name) {
            return Err(InputError::Unknown { name: name.to_string(), expected: names() });
        }
        if inputs[..i].iter().any(|(n, _)| n == name) {
            return Err(InputError::Duplicate(name.to_string()));
        }
    }
    let mut facts = Vec::new();
    let mut dims = Vec::new();
    for &(name, ty) in expected {
        let Some((_, t)) = inputs.iter().find(|(n, _)| *n == name) else {
            return Err(InputError::Missing { name: name.to_string(), expected: names() });
        };
        if t.dtype() != ty.dtype {
            let (expected, got) = (ty.dtype, t.dtype());
            return Err(InputError::DType { name: name.into(), expected, ty: ty.to_string(), got });
        }
        if t.shape().len() != ty.rank() {
            let got = t.shape().to_vec();
            return Err(InputError::Rank { name: name.into(), rank: ty.rank(), ty: ty.to_string(), got });
        }
        for (i, (expr, &d)) in ty.shape.iter().zip(t.shape()).enumerate() {
            let value = i64::try_from(d).unwrap_or(i64::MAX);
            dims.push(value);
            facts.push(DimFact { expr: expr.clone(), value, what: format!("input '{name}' dim {i}") });
        }
    }
    Ok((env.bind(&facts).map_err(InputError::Binding)?, dims))
}

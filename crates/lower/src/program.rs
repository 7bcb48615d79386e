//! A loop program: one generated function. A loop nest over a symbolic space
//! whose body stores the values of one or more tensors, each an expression of
//! the loop variables over the program's buffers (its parameters).

use ir::DType;

use crate::expr::{Exprs, E};

/// A buffer the program reads or writes: dense, row-major, of a symbolic shape.
#[derive(Clone, Debug)]
pub struct Param {
    pub name: String,
    pub dtype: DType,
    /// Extents (each an integer constant or a dim of the model's dim table).
    pub shape: Vec<E>,
    pub written: bool,
}

/// `param[linear position of the nest] = value`: every store writes a dense
/// buffer with as many elements as the nest has points, at the nest's own
/// row-major position, so the innermost variable writes contiguous memory.
#[derive(Clone, Debug)]
pub struct Store {
    pub param: u32,
    pub value: E,
}

/// One generated function: `for vars in space: stores`.
#[derive(Clone, Debug)]
pub struct LoopProgram {
    pub name: String,
    pub exprs: Exprs,
    pub params: Vec<Param>,
    /// The nest's extents, outermost first.
    pub space: Vec<E>,
    /// The nest's variables (a variable of extent 1 is the constant 0).
    pub vars: Vec<E>,
    pub stores: Vec<Store>,
    /// The message of each error code a `Check` may record (code `c` is `checks[c - 1]`).
    pub checks: Vec<String>,
    /// Conditions of run-time dims the program is compiled in versions for
    /// (one nest per combination of their values, see [`crate::versions`]).
    pub guards: Vec<E>,
}

impl LoopProgram {
    /// The guards of the program's loads along its innermost variable
    /// ([`crate::versions::guards`]).
    pub fn find_guards(&self) -> Vec<E> {
        let inner = self.inner().and_then(|i| match self.exprs.node(self.vars[i]) {
            crate::expr::Node::Var(v) => Some(*v),
            _ => None,
        });
        crate::versions::guards(&self.exprs, &self.stores, inner)
    }

    /// The innermost variable that really loops (extent not 1), if any: the
    /// axis the code generator vectorizes.
    pub fn inner(&self) -> Option<usize> {
        self.vars.iter().rposition(|v| matches!(self.exprs.node(*v), crate::expr::Node::Var(_)))
    }
}

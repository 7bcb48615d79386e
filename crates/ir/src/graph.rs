//! The SSA graph: values typed by dtype and symbolic shape, nodes in topological
//! order, and the `ShapeEnv` that gives the shapes meaning.

use std::collections::HashSet;
use std::fmt;

use sym::ShapeEnv;

use crate::{Op, TensorType};

/// Index of a value in its graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// A value: its name (unique in the graph) and type.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    pub name: String,
    pub ty: TensorType,
}

/// One operation producing one value.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub output: ValueId,
}

/// A model: inputs, nodes in topological order, outputs, and the shape facts.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub env: ShapeEnv,
    values: Vec<Value>,
    names: HashSet<String>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

impl Graph {
    pub fn new(env: ShapeEnv) -> Graph {
        Graph { env, ..Graph::default() }
    }

    /// A new value named `hint`, or `hint_1`, `hint_2`… when taken.
    pub fn add_value(&mut self, hint: &str, ty: TensorType) -> ValueId {
        let hint = if hint.is_empty() { "t" } else { hint };
        let mut name = hint.to_string();
        let mut k = 1;
        while self.names.contains(&name) {
            name = format!("{hint}_{k}");
            k += 1;
        }
        self.names.insert(name.clone());
        self.values.push(Value { name, ty });
        ValueId(self.values.len() as u32 - 1)
    }

    /// Declare a graph input.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> ValueId {
        let v = self.add_value(name, ty);
        self.inputs.push(v);
        v
    }

    /// Append a node computing a new value of type `ty` named after `hint`.
    pub fn add_node(&mut self, op: Op, inputs: Vec<ValueId>, hint: &str, ty: TensorType) -> ValueId {
        let output = self.add_value(hint, ty);
        self.nodes.push(Node { op, inputs, output });
        output
    }

    /// Insert a node at position `at` of the node list (rewrites that must keep
    /// the topological order put new nodes before their first consumer).
    pub fn insert_node(
        &mut self,
        at: usize,
        op: Op,
        inputs: Vec<ValueId>,
        hint: &str,
        ty: TensorType,
    ) -> ValueId {
        let output = self.add_value(hint, ty);
        self.nodes.insert(at.min(self.nodes.len()), Node { op, inputs, output });
        output
    }

    pub fn value(&self, v: ValueId) -> &Value {
        &self.values[v.index()]
    }
    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.values[v.index()].ty
    }
    pub fn name(&self, v: ValueId) -> &str {
        &self.values[v.index()].name
    }
    pub fn values(&self) -> &[Value] {
        &self.values
    }
    pub fn num_values(&self) -> usize {
        self.values.len()
    }

    /// Give `v` exactly the name `name`; a value already holding it is renamed
    /// to `name_1`, `name_2`… (names stay unique).
    pub fn rename(&mut self, v: ValueId, name: &str) {
        if self.values[v.index()].name == name {
            return;
        }
        if let Some(holder) = self.find(name) {
            let mut k = 1;
            let fresh = loop {
                let cand = format!("{name}_{k}");
                if !self.names.contains(&cand) {
                    break cand;
                }
                k += 1;
            };
            self.names.insert(fresh.clone());
            self.values[holder.index()].name = fresh;
        } else {
            self.names.insert(name.to_string());
        }
        let old = std::mem::replace(&mut self.values[v.index()].name, name.to_string());
        self.names.remove(&old);
    }

    /// The value with this name.
    pub fn find(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v.name == name).map(|i| ValueId(i as u32))
    }

    /// Rewrite every dim and symbolic attribute with all the facts the `ShapeEnv`
    /// holds now (a fact learned late turns `min(64, seq)` into `seq` everywhere).
    pub fn simplify_shapes(&mut self) {
        let env = self.env.clone();
        let simp = |e: &mut sym::SymExpr| *e = env.simplify(e);
        for v in &mut self.values {
            v.ty.shape.iter_mut().for_each(simp);
        }
        for n in &mut self.nodes {
            match &mut n.op {
                Op::SymConst(v) => v.iter_mut().for_each(simp),
                Op::Slice { axes } => axes.iter_mut().for_each(|a| simp(&mut a.start)),
                Op::Pad { pads, .. } => pads.iter_mut().for_each(|(b, e)| {
                    simp(b);
                    simp(e)
                }),
                _ => {}
            }
        }
    }

    /// Make every use of `old` (node inputs and graph outputs) read `new` instead.
    /// A graph output keeps its name: `new` takes it over, unless `new` is itself
    /// an input or output, in which case a copy node carries the name.
    pub fn replace_uses(&mut self, old: ValueId, new: ValueId) {
        if old == new {
            return;
        }
        for n in &mut self.nodes {
            n.inputs.iter_mut().filter(|v| **v == old).for_each(|v| *v = new);
        }
        if !self.outputs.contains(&old) {
            return;
        }
        let name = self.name(old).to_string();
        let target = if self.inputs.contains(&new) || self.outputs.contains(&new) {
            let ty = self.ty(new).clone();
            self.add_node(Op::Reshape, vec![new], &name, ty)
        } else {
            new
        };
        self.rename(old, &format!("{name}.replaced"));
        self.rename(target, &name);
        self.outputs.iter_mut().filter(|v| **v == old).for_each(|v| *v = target);
    }

    /// How many node inputs and graph outputs read each value.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut c = vec![0; self.values.len()];
        for n in &self.nodes {
            n.inputs.iter().for_each(|v| c[v.index()] += 1);
        }
        self.outputs.iter().for_each(|v| c[v.index()] += 1);
        c
    }

    /// Drop nodes no output depends on; returns how many were dropped.
    pub fn remove_dead_nodes(&mut self) -> usize {
        let mut live = vec![false; self.values.len()];
        self.outputs.iter().for_each(|o| live[o.index()] = true);
        for n in self.nodes.iter().rev() {
            if live[n.output.index()] {
                n.inputs.iter().for_each(|i| live[i.index()] = true);
            }
        }
        let before = self.nodes.len();
        self.nodes.retain(|n| live[n.output.index()]);
        before - self.nodes.len()
    }

    /// For each value, the index of the node producing it (`None` for inputs).
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut p = vec![None; self.values.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            p[n.output.index()] = Some(i);
        }
        p
    }
}

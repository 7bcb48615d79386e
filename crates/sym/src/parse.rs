//! Parser for the printed form of `SymExpr` (`batch*seq`, `(h+1)/2`, `min(a, 4)`).
//!
//! Grammar (left-associative, `/` and `%` take a positive integer right operand):
//! ```text
//! expr   := ['-'] term (('+' | '-') term)*
//! term   := factor (('*' | '/' | '%') factor)*
//! factor := INT | IDENT | ('min' | 'max') '(' expr (',' expr)* ')' | '(' expr ')'
//! ```
//! A leading `-` negates the whole first term, which is how the printer writes it.
//! `min` and `max` are reserved: they must be followed by `(`. Parentheses nest at
//! most [`MAX_DEPTH`] deep, so hostile input is an error, not a stack overflow.

use crate::{SymError, SymExpr};

/// How deep parentheses and `min`/`max` calls may nest.
pub const MAX_DEPTH: usize = 200;

/// Parse a symbolic expression.
pub fn parse_expr(text: &str) -> Result<SymExpr, SymError> {
    let mut p = Parser { s: text.as_bytes(), i: 0, text, depth: 0 };
    let e = p.expr()?;
    p.ws();
    if p.i != p.s.len() {
        return Err(p.err("unexpected trailing text"));
    }
    Ok(e)
}

/// Characters allowed in a symbol name after the first (`[A-Za-z_][A-Za-z0-9_]*`).
pub fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// A valid symbol name: non-empty, `[A-Za-z_][A-Za-z0-9_]*`, not `min`/`max`.
pub fn is_valid_symbol_name(name: &str) -> bool {
    let mut ch = name.chars();
    matches!(ch.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && ch.all(is_ident_char)
        && name != "min"
        && name != "max"
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    text: &'a str,
    depth: usize,
}

impl Parser<'_> {
    fn err(&self, what: &str) -> SymError {
        SymError::Parse { text: self.text.to_string(), pos: self.i, what: what.to_string() }
    }

    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expr(&mut self) -> Result<SymExpr, SymError> {
        let neg = self.eat(b'-');
        let mut acc = self.term()?;
        if neg {
            acc = acc.try_scale(-1)?;
        }
        loop {
            if self.eat(b'+') {
                acc = acc.try_add(&self.term()?)?;
            } else if self.eat(b'-') {
                acc = acc.try_sub(&self.term()?)?;
            } else {
                return Ok(acc);
            }
        }
    }

    fn term(&mut self) -> Result<SymExpr, SymError> {
        let mut acc = self.factor()?;
        loop {
            match self.peek() {
                Some(b'*') => {
                    self.i += 1;
                    acc = acc.try_mul(&self.factor()?)?;
                }
                Some(op @ (b'/' | b'%')) => {
                    self.i += 1;
                    let at = self.i;
                    let d = self.factor()?;
                    let Some(c) = d.as_const().filter(|c| *c > 0) else {
                        self.i = at;
                        return Err(self.err("`/` and `%` need a positive integer divisor"));
                    };
                    acc = if op == b'%' { acc.try_rem(c)? } else { acc.try_floor_div(c)? };
                }
                _ => return Ok(acc),
            }
        }
    }

    fn factor(&mut self) -> Result<SymExpr, SymError> {
        if self.depth >= MAX_DEPTH {
            return Err(self.err("expression nested too deeply"));
        }
        self.depth += 1;
        let r = self.factor_inner();
        self.depth -= 1;
        r
    }

    fn factor_inner(&mut self) -> Result<SymExpr, SymError> {
        match self.peek() {
            Some(b'(') => {
                self.i += 1;
                let e = self.expr()?;
                if !self.eat(b')') {
                    return Err(self.err("expected `)`"));
                }
                Ok(e)
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.i;
                while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                    self.i += 1;
                }
                self.text[start..self.i]
                    .parse::<i64>()
                    .map(SymExpr::constant)
                    .map_err(|_| self.err("integer out of range"))
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.i;
                while self.i < self.s.len() && is_ident_char(self.s[self.i] as char) {
                    self.i += 1;
                }
                let name = &self.text[start..self.i];
                if name == "min" || name == "max" {
                    if !self.eat(b'(') {
                        return Err(self.err("expected `(` after min/max"));
                    }
                    let mut args = vec![self.expr()?];
                    while self.eat(b',') {
                        args.push(self.expr()?);
                    }
                    if !self.eat(b')') {
                        return Err(self.err("expected `)` after min/max arguments"));
                    }
                    return Ok(SymExpr::minmax(args, name == "max"));
                }
                Ok(SymExpr::symbol(name))
            }
            _ => Err(self.err("expected a number, a symbol or `(`")),
        }
    }
}

pub mod support;
pub mod recipe;

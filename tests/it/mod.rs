pub mod support;

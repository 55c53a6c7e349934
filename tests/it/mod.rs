pub mod support;
pub mod oci;
pub mod deploy;
pub mod recipe;
pub mod faultproxy;
pub mod registry;
pub mod registry_support;
pub mod slim;

//! PLACEHOLDER: being written. Replace whole file.
use crate::env::Env;
use crate::error::{CoreError, Result};
use crate::registry::Kwargs;

pub fn make(_kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    Err(CoreError::InvalidArgument(
        "wordle not implemented yet".into(),
    ))
}

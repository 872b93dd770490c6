//! PLACEHOLDER
use crate::env::Env;
use crate::error::{CoreError, Result};
use crate::registry::Kwargs;

pub fn make(_kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    Err(CoreError::InvalidArgument(
        "game2048 not implemented yet".into(),
    ))
}

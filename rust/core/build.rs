//! Bundles the TextCraft recipe files (`envs/textcraft/recipes/*.json`) into the crate: writes
//! `$OUT_DIR/textcraft_recipes.rs` with a sorted `&[(file name, include_str!(...))]` table.

use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dir = manifest.join("../../envs/textcraft/recipes");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json"))
        .collect();
    names.sort();
    let mut src = String::from("/// TextCraft recipe files, sorted by name.\n");
    src.push_str("pub static RECIPE_FILES: &[(&str, &str)] = &[\n");
    for name in &names {
        let path = dir.join(name).canonicalize().expect("recipe path");
        println!("cargo:rerun-if-changed={}", path.display());
        src.push_str(&format!(
            "    ({name:?}, include_str!({:?})),\n",
            path.display().to_string()
        ));
    }
    src.push_str("];\n");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("textcraft_recipes.rs");
    fs::write(out, src).expect("write textcraft_recipes.rs");
}

//! Rebuilds when a migration changes: `sqlx::migrate!` embeds the
//! `migrations` folder at compile time, but Cargo would not notice a new file.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}

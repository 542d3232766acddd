//! Link the gateway's binary with compressed debug sections: the release
//! profile keeps Rust line tables (readable backtraces), which are most of
//! its size uncompressed; zlib-compressed they are about a quarter
//! of it, and Rust's backtrace symbolizer reads compressed sections.

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--compress-debug-sections=zlib");
}

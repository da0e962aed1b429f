//! `agentry-sandbox '<spec as JSON>'`: runs one command confined, for the
//! tool runner. See the `agentry_sandbox` crate.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(agentry_sandbox::helper::run_main(&args));
}

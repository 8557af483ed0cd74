fn main() -> std::process::ExitCode {
    ondo::cli::main()
}

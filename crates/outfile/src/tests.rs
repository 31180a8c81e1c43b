use super::*;
use std::io::Write;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redlite-outfile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn target_appears_only_on_commit() {
    let d = scratch("commit");
    let t = d.join("out.bin");
    std::fs::write(&t, b"old").unwrap();
    let mut o = Output::create(&t, &[]).unwrap();
    o.write_all(b"new bytes").unwrap();
    o.flush().unwrap();
    let tmp = o.temp_path().unwrap().to_path_buf();
    assert_eq!(
        tmp.parent(),
        Some(d.as_path()),
        "the temporary is beside the target"
    );
    assert!(tmp.exists());
    assert_eq!(
        std::fs::read(&t).unwrap(),
        b"old",
        "target untouched until commit"
    );
    assert!(pending_temporaries().contains(&tmp));
    o.commit().unwrap();
    assert_eq!(std::fs::read(&t).unwrap(), b"new bytes");
    assert_eq!(names(&d), ["out.bin"]);
    assert!(!pending_temporaries().contains(&tmp));
}

#[test]
fn drop_without_commit_removes_the_temporary_and_keeps_the_target() {
    let d = scratch("drop");
    let t = d.join("out.bin");
    std::fs::write(&t, b"precious").unwrap();
    {
        let mut o = Output::create(&t, &[]).unwrap();
        o.write_all(&[7u8; 3 << 20]).unwrap();
        assert_eq!(names(&d).len(), 2);
    }
    assert_eq!(names(&d), ["out.bin"]);
    assert_eq!(std::fs::read(&t).unwrap(), b"precious");
    let new = d.join("never.bin");
    drop(Output::create(&new, &[]).unwrap());
    assert!(
        !new.exists(),
        "no 0-byte file for an output never committed"
    );
}

#[test]
fn same_file_as_an_input_is_refused_by_device_and_inode() {
    let d = scratch("same");
    let input = d.join("model.gguf");
    std::fs::write(&input, b"model bytes").unwrap();
    let link = d.join("hard.gguf");
    std::fs::hard_link(&input, &link).unwrap();
    let sym = d.join("sym.gguf");
    std::os::unix::fs::symlink(&input, &sym).unwrap();
    let spelled = d.join("sub/../model.gguf");
    std::fs::create_dir(d.join("sub")).unwrap();
    for target in [&input, &link, &sym, &spelled] {
        let e = Output::create(target, &[Path::new("/nonexistent/other"), &input]).err();
        match e {
            Some(OutfileError::SameAsInput { path, input: i }) => {
                assert_eq!(&path, target);
                assert_eq!(i, input);
            }
            other => panic!("{}: expected SameAsInput, got {other:?}", target.display()),
        }
        let e = OutputDir::create(target, &[&input]).err();
        assert!(matches!(e, Some(OutfileError::SameAsInput { .. })), "{e:?}");
    }
    assert_eq!(std::fs::read(&input).unwrap(), b"model bytes");
    assert_eq!(names(&d), ["hard.gguf", "model.gguf", "sub", "sym.gguf"]);
    // A different file is fine.
    Output::create(d.join("other.bin"), &[&input])
        .unwrap()
        .commit()
        .unwrap();
}

#[test]
fn a_directory_is_refused_before_anything_is_created() {
    let d = scratch("dir");
    let e = Output::create(&d, &[]).err().unwrap();
    assert!(
        matches!(&e, OutfileError::IsDirectory { path } if path == &d),
        "{e:?}"
    );
    assert!(e.to_string().contains(&d.display().to_string()));
    assert!(e.to_string().contains("is a directory"));
    let e = OutputDir::create(&d, &[]).err().unwrap();
    assert!(matches!(e, OutfileError::IsDirectory { .. }));
    assert!(names(&d).is_empty());
    let hidden = format!(".{}.", d.file_name().unwrap().to_string_lossy());
    assert!(
        names(d.parent().unwrap())
            .iter()
            .all(|n| !n.starts_with(&hidden)),
        "no temporary beside the directory"
    );
}

#[test]
fn a_failed_rename_removes_the_temporary_and_names_the_target() {
    let d = scratch("rename");
    let t = d.join("out.bin");
    let mut o = Output::create(&t, &[]).unwrap();
    o.write_all(b"x").unwrap();
    // The target turns into a non-empty directory while writing: the
    // rename must fail.
    std::fs::create_dir(&t).unwrap();
    std::fs::write(t.join("keep"), b"k").unwrap();
    let e = o.commit().unwrap_err();
    assert!(e.to_string().contains(&t.display().to_string()), "{e}");
    assert_eq!(names(&d), ["out.bin"]);
    assert_eq!(names(&t), ["keep"]);
}

#[test]
fn a_missing_directory_is_an_error_naming_the_target() {
    let t = std::env::temp_dir().join(format!(
        "redlite-outfile-none-{}/x/out.bin",
        std::process::id()
    ));
    let e = Output::create(&t, &[]).err().unwrap();
    assert!(matches!(e, OutfileError::Io { .. }));
    assert!(e.to_string().contains(&t.display().to_string()), "{e}");
}

#[test]
fn a_device_is_written_directly() {
    let mut o = Output::create("/dev/null", &[]).unwrap();
    assert!(o.temp_path().is_none());
    o.write_all(b"discarded").unwrap();
    o.commit().unwrap();
    assert!(matches!(
        OutputDir::create("/dev/null", &[]).err(),
        Some(OutfileError::NotRegular { .. })
    ));
}

#[test]
fn output_dir_moves_the_inner_file_or_removes_everything() {
    let d = scratch("outdir");
    let t = d.join("model.gguf");
    let od = OutputDir::create(&t, &[]).unwrap();
    assert_eq!(od.path().file_name(), t.file_name());
    std::fs::write(od.path(), b"gguf").unwrap();
    std::fs::write(od.path().with_extension("stray"), b"s").unwrap();
    od.commit().unwrap();
    assert_eq!(std::fs::read(&t).unwrap(), b"gguf");
    assert_eq!(names(&d), ["model.gguf"]);

    let t2 = d.join("second.gguf");
    {
        let od = OutputDir::create(&t2, &[]).unwrap();
        std::fs::write(od.path(), b"half").unwrap();
    }
    assert_eq!(names(&d), ["model.gguf"]);
}

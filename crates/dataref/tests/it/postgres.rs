//! `dataref doctor` on a real PostgreSQL source (a throwaway server).

use std::process::Command;

use dataref_test_support::TestPostgres;

use super::BIN;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_lists_the_roles_the_login_role_can_use() {
    let pg = TestPostgres::start().unwrap();
    pg.execute(
        "CREATE ROLE dataref_login LOGIN NOINHERIT;
         CREATE ROLE eu_analyst NOLOGIN;
         GRANT eu_analyst TO dataref_login;",
    )
    .await
    .unwrap();
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("dataref.toml");
    let write = |url: &str| {
        std::fs::write(
            &config,
            format!(
                "[server]\nprincipal = \"eu\"\n[python]\nenabled = false\n\
                 [sources.warehouse]\nkind = \"postgres\"\nurl = \"{url}\"\n\
                 [principals.eu]\npg_role = \"eu_analyst\"\n\
                 [principals.ghost]\n"
            ),
        )
        .unwrap();
    };
    let doctor = || {
        let out = Command::new(BIN)
            .arg("doctor")
            .arg("--home")
            .arg(home.path())
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    write(&pg.conninfo("dataref_login"));
    let out = doctor();
    let line = out
        .lines()
        .find(|l| l.contains("source warehouse"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("as `dataref_login`"), "{out}");
    assert!(line.contains("can run as: eu → eu_analyst"), "{out}");
    assert!(
        line.contains("cannot: ghost → ghost (no such role)"),
        "{out}"
    );
    assert!(line.trim_start().starts_with("warn"), "{out}");

    write(&format!(
        "host={} port=5432 user=dataref_login",
        home.path().join("nowhere").display()
    ));
    let out = doctor();
    let line = out
        .lines()
        .find(|l| l.contains("source warehouse"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.trim_start().starts_with("FAIL"), "{out}");
    assert!(out.contains("hint: check the source's `url`"), "{out}");
}

/// With `allow_sql`, doctor logs in as each principal's own role and fails when one can
/// become another principal's role (or cannot log in), unless the source accepts the
/// shared login.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_the_logins_of_model_sql() {
    let pg = TestPostgres::start().unwrap();
    pg.execute(
        "CREATE ROLE dataref_login LOGIN NOINHERIT;
         CREATE ROLE eu_analyst LOGIN;
         CREATE ROLE us_analyst LOGIN;
         CREATE ROLE sleeper NOLOGIN;
         GRANT eu_analyst, us_analyst, sleeper TO dataref_login;",
    )
    .await
    .unwrap();
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("dataref.toml");
    let write = |extra: &str, principals: &str| {
        std::fs::write(
            &config,
            format!(
                "[server]\nprincipal = \"eu\"\n[python]\nenabled = false\n\
                 [sources.warehouse]\nkind = \"postgres\"\nurl = \"{}\"\nallow_sql = true\n{extra}\n\
                 [principals.eu]\npg_role = \"eu_analyst\"\n\
                 [principals.us]\npg_role = \"us_analyst\"\n{principals}",
                pg.conninfo("dataref_login")
            ),
        )
        .unwrap();
    };
    let doctor = || {
        let out = Command::new(BIN)
            .arg("doctor")
            .arg("--home")
            .arg(home.path())
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = out
            .lines()
            .find(|l| l.contains("source warehouse"))
            .unwrap_or_else(|| panic!("{out}"))
            .to_owned();
        (out, line)
    };

    write("", "");
    let (out, line) = doctor();
    assert!(line.trim_start().starts_with("ok"), "{out}");
    assert!(
        line.contains("model SQL logs in as: eu → eu_analyst (safe), us → us_analyst (safe)"),
        "{out}"
    );

    pg.execute("GRANT eu_analyst TO us_analyst").await.unwrap();
    let (out, line) = doctor();
    assert!(line.trim_start().starts_with("FAIL"), "{out}");
    assert!(
        line.contains("us → us_analyst (UNSAFE: can become eu_analyst)"),
        "{out}"
    );
    assert!(out.contains("allow_sql_shared_roles"), "{out}");
    pg.execute("REVOKE eu_analyst FROM us_analyst")
        .await
        .unwrap();

    write("", "[principals.sleepy]\npg_role = \"sleeper\"\n");
    let (out, line) = doctor();
    assert!(line.trim_start().starts_with("FAIL"), "{out}");
    assert!(line.contains("sleepy → sleeper (login fails:"), "{out}");

    // The operator accepts the shared login: a warning, no failure.
    write(
        "allow_sql_shared_roles = true",
        "[principals.sleepy]\npg_role = \"sleeper\"\n",
    );
    let (out, line) = doctor();
    assert!(line.trim_start().starts_with("warn"), "{out}");
    assert!(line.contains("allow_sql_shared_roles = true"), "{out}");
}

//! The ADBC C ABI (version 1.0.0), spoken to a driver's shared library directly: the
//! driver's function table, its database, connection and statement handles, and its
//! result as an Arrow C stream that arrow-rs imports — so the process keeps one arrow.
//!
//! Runs only in the worker process (`dataref adbc-worker`): a driver is native code, and
//! whatever it does (a crash, a leak, a hang in C) stays in that process.

#![expect(
    unsafe_code,
    reason = "a C ABI: the driver's function table, handles and the Arrow C data interface"
)]

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::Path;
use std::ptr;

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use arrow_array::{Array, RecordBatch, StructArray};

/// `ADBC_VERSION_1_0_0`.
const VERSION_1_0_0: c_int = 1_000_000;
const STATUS_OK: u8 = 0;
const STATUS_NOT_IMPLEMENTED: u8 = 2;
const STATUS_INVALID_ARGUMENT: u8 = 5;

/// `struct AdbcError` (1.1.0 layout; a 1.0.0 driver writes only the first four fields).
#[repr(C)]
struct AdbcError {
    message: *mut c_char,
    vendor_code: i32,
    sqlstate: [c_char; 5],
    release: Option<unsafe extern "C" fn(*mut AdbcError)>,
    private_data: *mut c_void,
    private_driver: *mut AdbcDriver,
}

/// `struct AdbcDatabase`, `AdbcConnection`, `AdbcStatement`: the same two pointers.
#[repr(C)]
struct Handle {
    private_data: *mut c_void,
    private_driver: *mut AdbcDriver,
}

type Status = u8;
type Err = *mut AdbcError;
type H = *mut Handle;
type Unused = Option<unsafe extern "C" fn()>;

/// `struct AdbcDriver`, the 1.0.0 functions in the header's order, then room for the
/// 1.1.0 ones (never called; zeroed).
#[repr(C)]
struct AdbcDriver {
    private_data: *mut c_void,
    private_manager: *mut c_void,
    release: Option<unsafe extern "C" fn(*mut AdbcDriver, Err) -> Status>,
    database_init: Option<unsafe extern "C" fn(H, Err) -> Status>,
    database_new: Option<unsafe extern "C" fn(H, Err) -> Status>,
    database_set_option:
        Option<unsafe extern "C" fn(H, *const c_char, *const c_char, Err) -> Status>,
    database_release: Option<unsafe extern "C" fn(H, Err) -> Status>,
    connection_commit: Unused,
    connection_get_info: Unused,
    connection_get_objects: Unused,
    connection_get_table_schema: Unused,
    connection_get_table_types: Unused,
    connection_init: Option<unsafe extern "C" fn(H, H, Err) -> Status>,
    connection_new: Option<unsafe extern "C" fn(H, Err) -> Status>,
    connection_set_option:
        Option<unsafe extern "C" fn(H, *const c_char, *const c_char, Err) -> Status>,
    connection_read_partition: Unused,
    connection_release: Option<unsafe extern "C" fn(H, Err) -> Status>,
    connection_rollback: Option<unsafe extern "C" fn(H, Err) -> Status>,
    statement_bind:
        Option<unsafe extern "C" fn(H, *mut FFI_ArrowArray, *mut FFI_ArrowSchema, Err) -> Status>,
    statement_bind_stream: Unused,
    statement_execute_query:
        Option<unsafe extern "C" fn(H, *mut FFI_ArrowArrayStream, *mut i64, Err) -> Status>,
    statement_execute_partitions: Unused,
    statement_get_parameter_schema: Unused,
    statement_new: Option<unsafe extern "C" fn(H, H, Err) -> Status>,
    statement_prepare: Option<unsafe extern "C" fn(H, Err) -> Status>,
    statement_release: Option<unsafe extern "C" fn(H, Err) -> Status>,
    statement_set_option:
        Option<unsafe extern "C" fn(H, *const c_char, *const c_char, Err) -> Status>,
    statement_set_sql_query: Option<unsafe extern "C" fn(H, *const c_char, Err) -> Status>,
    statement_set_substrait_plan: Unused,
    newer: [Unused; 48],
}

type InitFunc = unsafe extern "C" fn(c_int, *mut c_void, Err) -> Status;

/// A failed driver call: its status, message and SQLSTATE.
#[derive(Debug)]
pub(crate) struct DriverError {
    pub status: u8,
    pub message: String,
    pub sqlstate: String,
}

impl DriverError {
    fn ours(message: impl Into<String>) -> Self {
        Self {
            status: 1,
            message: message.into(),
            sqlstate: String::new(),
        }
    }

    /// ADBC's name of the status.
    pub(crate) fn status_name(&self) -> &'static str {
        match self.status {
            2 => "NOT_IMPLEMENTED",
            3 => "NOT_FOUND",
            5 => "INVALID_ARGUMENT",
            6 => "INVALID_STATE",
            7 => "INVALID_DATA",
            9 => "INTERNAL",
            10 => "IO",
            11 => "CANCELLED",
            12 => "TIMEOUT",
            13 => "UNAUTHENTICATED",
            14 => "UNAUTHORIZED",
            _ => "UNKNOWN",
        }
    }
}

fn new_error() -> AdbcError {
    AdbcError {
        message: ptr::null_mut(),
        vendor_code: 0,
        sqlstate: [0; 5],
        release: None,
        private_data: ptr::null_mut(),
        private_driver: ptr::null_mut(),
    }
}

fn new_handle() -> Handle {
    Handle {
        private_data: ptr::null_mut(),
        private_driver: ptr::null_mut(),
    }
}

/// Turns a status and the error the driver filled into a result, releasing the error.
fn check(status: Status, error: &mut AdbcError, what: &str) -> Result<(), DriverError> {
    let message = if error.message.is_null() {
        None
    } else {
        // SAFETY: a non-null message is a NUL-terminated string the driver owns until
        // `release` is called below.
        Some(
            unsafe { CStr::from_ptr(error.message) }
                .to_string_lossy()
                .into_owned(),
        )
    };
    let sqlstate: String = error
        .sqlstate
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| char::from(c as u8))
        .collect();
    if let Some(release) = error.release.take() {
        // SAFETY: the driver's own release function for the error it filled.
        unsafe { release(error) };
    }
    error.message = ptr::null_mut();
    if status == STATUS_OK {
        return Ok(());
    }
    Err(DriverError {
        status,
        message: message.unwrap_or_else(|| format!("{what} failed")),
        sqlstate,
    })
}

fn cstring(s: &str, what: &str) -> Result<CString, DriverError> {
    CString::new(s).map_err(|_| DriverError::ours(format!("{what} contains a NUL byte")))
}

/// A loaded driver with one open database and connection.
pub(crate) struct Driver {
    // Field order is drop order: the table before the library it points into.
    driver: Box<AdbcDriver>,
    database: Box<Handle>,
    connection: Box<Handle>,
    _library: libloading::Library,
}

macro_rules! call {
    ($self:ident, $f:ident, $what:expr, $($arg:expr),*) => {{
        let f = $self.driver.$f.ok_or_else(|| DriverError::ours(format!("the driver has no {}", $what)))?;
        let mut error = new_error();
        // SAFETY: a function of the driver's table, called with handles it initialised
        // and an error struct it may fill.
        let status = unsafe { f($($arg,)* &mut error) };
        check(status, &mut error, $what)
    }};
}

impl Driver {
    /// Loads `library`, calls `entrypoint` for ADBC 1.0.0, and opens a database with
    /// `database` options and a connection with `connection` options.
    pub(crate) fn open(
        library: &Path,
        entrypoint: &str,
        database: &BTreeMap<String, String>,
        connection: &BTreeMap<String, String>,
    ) -> Result<Self, DriverError> {
        // SAFETY: loading a driver library runs its initialisers; the operator named it
        // in the config, and this process exists to contain it.
        let lib = unsafe { libloading::Library::new(library) }.map_err(|e| {
            DriverError::ours(format!(
                "cannot load the driver `{}`: {e}",
                library.display()
            ))
        })?;
        let symbol = cstring(entrypoint, "the entrypoint")?;
        // SAFETY: the entrypoint has ADBC's `AdbcDriverInitFunc` signature.
        let init: libloading::Symbol<'_, InitFunc> = unsafe { lib.get(symbol.as_bytes_with_nul()) }
            .map_err(|e| {
                DriverError::ours(format!(
                    "the driver `{}` has no entrypoint `{entrypoint}`: {e}",
                    library.display()
                ))
            })?;
        // SAFETY: an all-zero table (null pointers, `None` functions) is what the driver
        // expects to fill.
        let mut driver: Box<AdbcDriver> = Box::new(unsafe { std::mem::zeroed() });
        let mut error = new_error();
        // SAFETY: the driver fills the table for the version asked.
        let status = unsafe {
            init(
                VERSION_1_0_0,
                ptr::from_mut::<AdbcDriver>(&mut driver).cast(),
                &mut error,
            )
        };
        check(status, &mut error, "the driver's initialisation")?;
        let mut d = Self {
            driver,
            database: Box::new(new_handle()),
            connection: Box::new(new_handle()),
            _library: lib,
        };
        let db: H = &mut *d.database;
        call!(d, database_new, "DatabaseNew", db)?;
        for (k, v) in database {
            let (k, v) = (
                cstring(k, "an option name")?,
                cstring(v, "an option value")?,
            );
            call!(
                d,
                database_set_option,
                "DatabaseSetOption",
                db,
                k.as_ptr(),
                v.as_ptr()
            )
            .map_err(|e| DriverError {
                message: format!("option `{}`: {}", k.to_string_lossy(), e.message),
                ..e
            })?;
        }
        call!(d, database_init, "DatabaseInit", db)?;
        let conn: H = &mut *d.connection;
        call!(d, connection_new, "ConnectionNew", conn)?;
        for (k, v) in connection {
            let (k, v) = (
                cstring(k, "an option name")?,
                cstring(v, "an option value")?,
            );
            call!(
                d,
                connection_set_option,
                "ConnectionSetOption",
                conn,
                k.as_ptr(),
                v.as_ptr()
            )?;
        }
        call!(d, connection_init, "ConnectionInit", conn, db)?;
        Ok(d)
    }

    /// Sets a connection option the driver may not have: `Ok(false)` when it does not.
    pub(crate) fn try_option(&mut self, key: &str, value: &str) -> Result<bool, DriverError> {
        let conn: H = &mut *self.connection;
        let k = cstring(key, "an option name")?;
        let v = cstring(value, "an option value")?;
        match call!(
            self,
            connection_set_option,
            "ConnectionSetOption",
            conn,
            k.as_ptr(),
            v.as_ptr()
        ) {
            Ok(()) => Ok(true),
            // Drivers without the option say NOT_IMPLEMENTED, some INVALID_ARGUMENT.
            Err(e) if e.status == STATUS_NOT_IMPLEMENTED || e.status == STATUS_INVALID_ARGUMENT => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs `sql` with `params` (one row; empty for none) and returns the result's
    /// batches as they come.
    pub(crate) fn query(
        &mut self,
        sql: &str,
        params: Option<RecordBatch>,
    ) -> Result<ArrowArrayStreamReader, DriverError> {
        let conn: H = &mut *self.connection;
        let mut statement = Box::new(new_handle());
        let stmt: H = &mut *statement;
        call!(self, statement_new, "StatementNew", conn, stmt)?;
        let text = cstring(sql, "the SQL")?;
        call!(
            self,
            statement_set_sql_query,
            "StatementSetSqlQuery",
            stmt,
            text.as_ptr()
        )?;
        if let Some(batch) = params {
            let data = StructArray::from(batch).into_data();
            let (array, schema) = arrow_array::ffi::to_ffi(&data)
                .map_err(|e| DriverError::ours(format!("the parameters: {e}")))?;
            let mut array = std::mem::ManuallyDrop::new(array);
            let mut schema = std::mem::ManuallyDrop::new(schema);
            // The driver takes both and releases them itself (ADBC's StatementBind), so
            // they are never dropped here.
            call!(
                self,
                statement_bind,
                "StatementBind",
                stmt,
                &mut *array,
                &mut *schema
            )?;
        }
        let mut stream = FFI_ArrowArrayStream::empty();
        let mut affected: i64 = -1;
        call!(
            self,
            statement_execute_query,
            "StatementExecuteQuery",
            stmt,
            &mut stream,
            &mut affected
        )?;
        // The statement stays open until the process ends: some drivers' streams read
        // through it.
        std::mem::forget(statement);
        ArrowArrayStreamReader::try_new(stream)
            .map_err(|e| DriverError::ours(format!("the driver's result stream: {e}")))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let conn: H = &mut *self.connection;
        let db: H = &mut *self.database;
        let _ = (|| -> Result<(), DriverError> {
            if !self.connection.private_data.is_null() {
                let _ = call!(self, connection_rollback, "ConnectionRollback", conn);
                call!(self, connection_release, "ConnectionRelease", conn)?;
            }
            if !self.database.private_data.is_null() {
                call!(self, database_release, "DatabaseRelease", db)?;
            }
            if let Some(release) = self.driver.release {
                let mut error = new_error();
                // SAFETY: the driver's own release, once, after its handles.
                let status = unsafe { release(&mut *self.driver, &mut error) };
                check(status, &mut error, "the driver's release")?;
            }
            Ok(())
        })();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_table_has_the_headers_layout() {
        // 2 data pointers + 27 functions of 1.0.0, then the room for 1.1.0.
        assert_eq!(
            std::mem::offset_of!(AdbcDriver, newer),
            29 * std::mem::size_of::<*const c_void>()
        );
        assert_eq!(std::mem::size_of::<Handle>(), 16);
        // message, vendor_code, sqlstate[5] (padded), release, private_data, private_driver.
        assert_eq!(std::mem::offset_of!(AdbcError, release), 24);
        assert_eq!(std::mem::size_of::<AdbcError>(), 48);
    }

    #[test]
    fn a_missing_library_is_an_error_not_a_crash() {
        let e = Driver::open(
            Path::new("/nonexistent/libadbc_driver_x.so"),
            "AdbcDriverInit",
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .err()
        .map(|e| e.message)
        .unwrap_or_default();
        assert!(e.contains("cannot load the driver"), "{e}");
    }
}

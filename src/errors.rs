//! One error type for the extension, mapped to a SQLSTATE at the SQL boundary.

use eventview_core::definition::DefinitionError;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;

#[derive(Debug)]
pub struct EvError {
    pub code: PgSqlErrorCode,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

pub type EvResult<T> = Result<T, EvError>;

impl EvError {
    pub fn new(code: PgSqlErrorCode, message: impl Into<String>) -> Self {
        EvError {
            code,
            message: message.into(),
            detail: None,
            hint: None,
        }
    }

    /// 22023: a definition or argument that cannot work.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, message)
    }

    /// 42P01: a relation that does not exist, named as Postgres would name it.
    pub fn undefined_table(name: &str) -> Self {
        let shown = eventview_core::quote::shown_name(name);
        Self::new(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("relation \"{shown}\" does not exist"),
        )
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn into_report(self) -> ErrorReport {
        // A message quoting user text that holds U+0000 (JSON "\u0000" in a definition) would be
        // cut short there, its hint lost: the character is written as its JSON escape.
        let shown = |text: String| {
            if text.contains('\0') {
                text.replace('\0', "\\u0000")
            } else {
                text
            }
        };
        let mut report = ErrorReport::new(self.code, shown(self.message), "pg_eventview");
        if let Some(d) = self.detail {
            report = report.set_detail(shown(d));
        }
        if let Some(h) = self.hint {
            report = report.set_hint(shown(h));
        }
        report
    }
}

impl From<DefinitionError> for EvError {
    fn from(e: DefinitionError) -> Self {
        EvError {
            code: PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            message: e.message,
            detail: None,
            hint: e.hint,
        }
    }
}

/// SPI-level failures (not SQL errors, which propagate as themselves) are internal errors.
impl From<pgrx::spi::SpiError> for EvError {
    fn from(e: pgrx::spi::SpiError) -> Self {
        Self::new(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("pg_eventview: SPI failure: {e}"),
        )
    }
}

/// Runs `f` and turns its error into an `ErrorReport` for a `#[pg_extern]` to return.
pub fn at_boundary<T>(f: impl FnOnce() -> EvResult<T>) -> Result<T, ErrorReport> {
    f().map_err(EvError::into_report)
}

//! The crate's error type, and `bail!` / `ensure!` / `.context(..)` in the
//! style the code was first written in (anyhow's), producing [`CudaError`].

/// Errors of the CUDA backend. Each names what it is about.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// NVRTC could not compile a kernel file (the log is in the message).
    #[error("{0}")]
    Compile(String),
    /// A size, shape, format or argument the device code cannot take.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Model(#[from] redlite_model::ModelError),
    #[error(transparent)]
    Cpu(#[from] redlite_cpu::CpuError),
    /// An error with what was being done when it happened.
    #[error("{what}: {source}")]
    Context {
        what: String,
        #[source]
        source: Box<CudaError>,
    },
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

impl CudaError {
    /// This error inside `what`.
    pub fn context(self, what: impl Into<String>) -> CudaError {
        CudaError::Context {
            what: what.into(),
            source: Box::new(self),
        }
    }
}

/// `.context(..)` and `.with_context(..)` on results and options.
pub trait Context<T> {
    fn context(self, what: impl Into<String>) -> Result<T>;
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T>;
}

impl<T, E: Into<CudaError>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|e| e.into().context(what))
    }
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| e.into().context(what()))
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.ok_or_else(|| CudaError::Invalid(what.into()))
    }
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.ok_or_else(|| CudaError::Invalid(what().into()))
    }
}

/// Return `CudaError::Invalid(format!(..))`.
macro_rules! bail {
    ($($t:tt)+) => {
        return Err($crate::error::CudaError::Invalid(format!($($t)+)))
    };
}

/// `bail!` unless the condition holds (without a message: the condition's
/// text).
macro_rules! ensure {
    ($c:expr $(,)?) => {
        if !$c {
            $crate::error::bail!("check failed: {}", stringify!($c));
        }
    };
    ($c:expr, $($t:tt)+) => {
        if !$c {
            $crate::error::bail!($($t)+);
        }
    };
}

pub(crate) use {bail, ensure};

#[cfg(test)]
mod tests {
    use super::*;

    fn f(x: usize) -> Result<usize> {
        ensure!(x > 1);
        ensure!(x < 10, "{x} is too large");
        if x == 5 {
            bail!("five");
        }
        Ok(x)
    }

    #[test]
    fn macros_and_context() {
        assert_eq!(f(3).unwrap(), 3);
        assert_eq!(f(1).unwrap_err().to_string(), "check failed: x > 1");
        assert_eq!(f(12).unwrap_err().to_string(), "12 is too large");
        assert_eq!(f(5).unwrap_err().to_string(), "five");
        let e = f(5).context("outer").unwrap_err();
        assert_eq!(e.to_string(), "outer: five");
        assert!(None::<u8>.context("missing").is_err());
    }
}

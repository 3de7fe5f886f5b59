//! Who a client logs in as where its URLs cannot say it: the primary that Sentinel names
//! (credentials in a sentinel URL are the sentinel's own).

/// A user name and password to log in with; `Debug` never shows the password.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) username: String,
    pub(crate) password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

//! The notices a release (or a force unlock) sends its waiters, one vocabulary for both
//! stores: Redis publishes them as text (`lua/*.lua`) and the pub/sub listener reads them
//! with [`Notice::read`]; the in-process store makes them as values. Either way they are
//! handed to [`Waiters::deliver`](crate::waiters::Waiters::deliver), the one function that
//! turns a notice into wake-ups.

use std::fmt;

/// One notice on a lock's channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice<'a> {
    /// A lock was released: one waiter may take it (`0`; Redisson's unlock messages `0`
    /// and `1` read the same, so waiters of either library wake on them).
    Released,
    /// A claim was completed: every waiter can use its outcome (`completed`).
    Completed,
    /// Every waiter may try again: a read-write lock a force unlock opened to readers, or
    /// a semaphore whose permits it freed (`read`).
    Open,
    /// A lock handed to the named holders with its fencing token: a fair lock's head, or a
    /// read-write lock's admitted readers (`granted:<token>:<holder> <holder>..`).
    Granted { token: u64, holders: Holders<'a> },
    /// A semaphore's permits granted to the named holders, each a hold of its own: the
    /// n-th named holds `first + n - 1` (`permits:<first>:<holder> <holder>..`).
    Permits { first: u64, holders: Holders<'a> },
    /// The named holders' turn, to take by asking (a fair lock's head after a force
    /// unlock: `wake:<holder>`).
    Turn { holders: Holders<'a> },
}

/// The holders a notice names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holders<'a> {
    /// As Redis sends them: holder ids separated by spaces, an admitted reader's named by
    /// its read hold's field (`<holder id>:r`, as the script stores it rather than cut in
    /// Lua: a holder id ends in its number, never in `:r`).
    Listed(&'a str),
    /// Holder ids, as the in-process store has them.
    Ids(&'a [&'a str]),
}

impl<'a> Holders<'a> {
    /// The holder ids, in order.
    pub(crate) fn ids(self) -> impl Iterator<Item = &'a str> {
        let (listed, ids) = match self {
            Holders::Listed(text) => (Some(text.split(' ')), None),
            Holders::Ids(ids) => (None, Some(ids.iter().copied())),
        };
        let listed = listed.into_iter().flatten();
        let listed = listed.map(|named| named.strip_suffix(":r").unwrap_or(named));
        listed.chain(ids.into_iter().flatten())
    }
}

/// A payload that is no notice of ours: logged by the listener, never taken for a wake-up
/// (a waiter it would have woken sleeps until the holder's lease ends, as without one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a lock notice: {:?}", self.0)
    }
}

impl<'a> Notice<'a> {
    /// Reads a notice as the scripts publish it.
    pub(crate) fn read(payload: &'a [u8]) -> Result<Self, Malformed> {
        let malformed = || Malformed(String::from_utf8_lossy(payload).into_owned());
        let text = std::str::from_utf8(payload).map_err(|_| malformed())?;
        let named = |rest: &'a str| match rest.split_once(':') {
            Some((token, holders)) if !holders.is_empty() => {
                Some((token.parse().ok()?, Holders::Listed(holders)))
            }
            _ => None,
        };
        let notice = match text {
            "0" | "1" => Some(Notice::Released),
            "completed" => Some(Notice::Completed),
            "read" => Some(Notice::Open),
            _ => match text.split_once(':') {
                Some(("granted", rest)) => {
                    named(rest).map(|(token, holders)| Notice::Granted { token, holders })
                }
                Some(("permits", rest)) => {
                    named(rest).map(|(first, holders)| Notice::Permits { first, holders })
                }
                Some(("wake", holders)) if !holders.is_empty() => Some(Notice::Turn {
                    holders: Holders::Listed(holders),
                }),
                _ => None,
            },
        };
        notice.ok_or_else(malformed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(holders: Holders<'_>) -> Vec<&str> {
        holders.ids().collect()
    }

    #[test]
    fn every_notice_a_script_sends_is_read() {
        assert_eq!(Notice::read(b"0"), Ok(Notice::Released));
        assert_eq!(
            Notice::read(b"1"),
            Ok(Notice::Released),
            "Redisson's read unlock"
        );
        assert_eq!(Notice::read(b"completed"), Ok(Notice::Completed));
        assert_eq!(Notice::read(b"read"), Ok(Notice::Open));
        match Notice::read(b"granted:1764089657123456:c1:7") {
            Ok(Notice::Granted { token, holders }) => {
                assert_eq!((token, ids(holders)), (1764089657123456, vec!["c1:7"]));
            }
            other => panic!("{other:?}"),
        }
        match Notice::read(b"granted:42:c1:7:r c2:19:r") {
            Ok(Notice::Granted { token, holders }) => {
                assert_eq!((token, ids(holders)), (42, vec!["c1:7", "c2:19"]));
            }
            other => panic!("{other:?}"),
        }
        match Notice::read(b"permits:17:c1:7 c2:19") {
            Ok(Notice::Permits { first, holders }) => {
                assert_eq!((first, ids(holders)), (17, vec!["c1:7", "c2:19"]));
            }
            other => panic!("{other:?}"),
        }
        match Notice::read(b"wake:c1:7") {
            Ok(Notice::Turn { holders }) => assert_eq!(ids(holders), vec!["c1:7"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn anything_else_is_malformed_not_a_wake_up() {
        for payload in [
            &b""[..],
            b"2",
            b"released",
            b"granted:x:c1:7",
            b"granted:42",
            b"granted:42:",
            b"permits:x:c1:7",
            b"wake:",
            b"\xff\xfe",
        ] {
            let read = Notice::read(payload);
            assert!(read.is_err(), "{payload:?} read as {read:?}");
        }
        let text = Notice::read(b"granted:x:c1:7").unwrap_err().to_string();
        assert!(text.contains("granted:x:c1:7"), "{text}");
    }

    #[test]
    fn ids_of_the_in_process_store_are_kept_as_they_are() {
        let named = ["c1:7", "c2:r1"];
        assert_eq!(ids(Holders::Ids(&named)), named);
    }
}

//! The Redis names of a rate limiter's buckets: for one key, one per policy, all under one
//! hash tag (so one decision touches one cluster slot), the key checked as a lock name is.
//!
//! `<namespace>rate:{<limiter>:<escaped key>}:<policy>`, the namespace and the key escaped
//! as lock names are (`%`, `{`, `}` percent-encoded), whatever the client's
//! [`KeyLayout`](crate::KeyLayout): a lock's keys have `{` right after the namespace, so
//! no lock name can make a bucket's name, and the other way round.

use crate::error::KeyError;
use crate::key::{escape_into, validate, KeySpace};

/// Where one limiter's buckets live: `<namespace>rate:{<limiter>:`, made once per limiter.
#[derive(Debug)]
pub(crate) struct RatePrefix {
    prefix: Box<str>,
    max_len: usize,
}

impl RatePrefix {
    /// The prefix of `limiter` (a checked limiter name) in `space`.
    pub(crate) fn new(space: &KeySpace, limiter: &str) -> Self {
        let mut prefix = String::with_capacity(space.namespace.len() + limiter.len() + 8);
        escape_into(&mut prefix, &space.namespace);
        prefix.push_str("rate:{");
        prefix.push_str(limiter);
        prefix.push(':');
        Self {
            prefix: prefix.into(),
            max_len: space.max_len,
        }
    }

    /// The buckets of `key` for each of `policies` (checked names), in their order.
    ///
    /// # Errors
    /// As a lock name: empty, longer than the client's limit, or with a control character.
    pub(crate) fn buckets<'p>(
        &self,
        key: &str,
        policies: impl ExactSizeIterator<Item = &'p str> + Clone,
    ) -> Result<Buckets, KeyError> {
        validate(key, self.max_len)?;
        let tagged_len = self.prefix.len() + 3 * key.len() + 2;
        let bytes = policies.clone().map(|p| tagged_len + p.len()).sum();
        let mut names = String::with_capacity(bytes);
        let mut ends = Vec::with_capacity(policies.len());
        for policy in policies {
            names.push_str(&self.prefix);
            escape_into(&mut names, key);
            names.push_str("}:");
            names.push_str(policy);
            ends.push(names.len());
        }
        Ok(Buckets { names, ends })
    }
}

/// The Redis names of one key's buckets, one per policy, in the limiter's order.
#[derive(Debug)]
pub(crate) struct Buckets {
    names: String,
    ends: Vec<usize>,
}

impl Buckets {
    /// Each bucket's name.
    pub(crate) fn names(&self) -> impl ExactSizeIterator<Item = &str> + Clone {
        (0..self.ends.len()).map(|i| {
            let start = i.checked_sub(1).map_or(0, |before| self.ends[before]);
            &self.names[start..self.ends[i]]
        })
    }

    /// How many buckets (policies) there are.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bucket_of_a_key_shares_its_hash_tag_and_names_its_policy() {
        let space = KeySpace::default();
        let prefix = RatePrefix::new(&space, "api");
        let buckets = prefix
            .buckets("tenant/{7}%", ["burst", "daily"].into_iter())
            .unwrap();
        let names: Vec<&str> = buckets.names().collect();
        assert_eq!(
            names,
            [
                "lockwarden:rate:{api:tenant/%7B7%7D%25}:burst",
                "lockwarden:rate:{api:tenant/%7B7%7D%25}:daily",
            ]
        );
        assert_eq!(buckets.len(), 2);
        assert_eq!(
            prefix.buckets("", ["burst"].into_iter()).unwrap_err(),
            KeyError::Empty
        );
        let long = "k".repeat(256);
        assert!(matches!(
            prefix.buckets(&long, ["burst"].into_iter()),
            Err(KeyError::TooLong { len: 256, max: 255 })
        ));
        let odd = KeySpace {
            namespace: "app{1}:".to_owned(),
            ..KeySpace::default()
        };
        let buckets = RatePrefix::new(&odd, "api")
            .buckets("k", ["p"].into_iter())
            .unwrap();
        assert_eq!(
            buckets.names().collect::<Vec<_>>(),
            ["app%7B1%7D:rate:{api:k}:p"]
        );
    }
}

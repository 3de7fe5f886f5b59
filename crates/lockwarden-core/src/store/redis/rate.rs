//! A rate decision on Redis: one `EVALSHA` of `lua/rate_limit.lua`, its keys the key's
//! buckets (one hash tag, so one slot), three arguments per policy.

use redis::Value;

use super::scripts::{Call, Variant, RATE_LIMIT};
use crate::error::BackendError;
use crate::store::contract::{Charge, Debts, RateAsk};

/// The call of one decision (its reply is read by [`decided`]).
///
/// Sent once more if its connection broke (see `Call::resendable`) unless it gives back:
/// a second run of a charge can only charge twice, which refuses more and never admits
/// more; a look and an emptying answer alike; a refund run twice would give back twice.
pub(super) fn decide(ask: &RateAsk<'_>, variant: Variant) -> Call {
    let keys: Vec<&str> = ask.buckets.names().collect();
    let mut call = Call::script(&RATE_LIMIT, variant, &keys);
    for policy in ask.policies {
        call = call
            .arg(ask.charge.increment(policy))
            .arg(ask.charge.room(policy))
            .arg(&*policy.spec);
    }
    call.resendable(!matches!(ask.charge, Charge::Refund(_)))
}

/// Reads the script's reply for `policies` policies: one debt (one policy) or a table of
/// them, each `-debt - 1` when the decision was refused.
pub(super) fn decided(reply: Value, policies: usize) -> Result<Debts, BackendError> {
    let numbers = match reply {
        Value::Int(debt) if policies == 1 => vec![debt],
        Value::Array(items) if policies > 1 && items.len() == policies => items
            .into_iter()
            .map(|item| match item {
                Value::Int(debt) => Ok(debt),
                other => Err(other),
            })
            .collect::<Result<_, _>>()
            .map_err(|other| protocol(policies, &other))?,
        other => return Err(protocol(policies, &other)),
    };
    let refused = numbers[0] < 0;
    let micros = numbers
        .iter()
        .map(|&n| match (refused, n) {
            (true, n) if n < 0 => Ok((-(n + 1)) as u64),
            (false, n) if n >= 0 => Ok(n as u64),
            _ => Err(protocol(policies, &Value::Int(n))),
        })
        .collect::<Result<_, _>>()?;
    Ok(Debts { refused, micros })
}

fn protocol(policies: usize, reply: &Value) -> BackendError {
    BackendError::Protocol(format!(
        "the rate limit script, for {policies} policies, returned {reply:?}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_read_as_debts_and_refusals() {
        let one = decided(Value::Int(10_000), 1).unwrap();
        assert_eq!((one.refused, one.micros), (false, vec![10_000]));
        let refused = decided(Value::Array(vec![Value::Int(-1), Value::Int(-7)]), 2).unwrap();
        assert_eq!((refused.refused, refused.micros), (true, vec![0, 6]));
        assert!(decided(Value::Int(5), 2).is_err());
        assert!(decided(Value::Array(vec![Value::Int(1), Value::Int(-2)]), 2).is_err());
        assert!(decided(Value::Array(vec![Value::Int(1)]), 2).is_err());
        assert!(decided(Value::Nil, 1).is_err());
    }
}

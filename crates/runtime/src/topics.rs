//! Broadcast by key: messages reach the subscribers of their key only, and
//! a key is forgotten with its last subscriber. The session store hands
//! each change to the watchers of its session this way, and the
//! orchestrator a session's streamed text to its subscribers: one append
//! wakes the readers of one session, not every reader.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::broadcast;

/// Channels by key, each holding up to `capacity` messages for a slow
/// subscriber (who then misses some: [`Subscription::recv`] says how many).
pub struct Topics<T> {
    capacity: usize,
    keys: Mutex<HashMap<String, broadcast::Sender<T>>>,
}

impl<T: Clone> Topics<T> {
    /// Topics whose subscribers may fall `capacity` messages behind.
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Topics {
            capacity: capacity.max(1),
            keys: Mutex::default(),
        })
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, broadcast::Sender<T>>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The messages of `key` from now on.
    pub fn subscribe(self: &Arc<Self>, key: &str) -> Subscription<T> {
        let receiver = self
            .keys()
            .entry(key.to_string())
            .or_insert_with(|| broadcast::channel(self.capacity).0)
            .subscribe();
        Subscription {
            topics: self.clone(),
            key: key.to_string(),
            receiver: Some(receiver),
        }
    }

    /// Sends `message` to the subscribers of `key` (none: dropped).
    pub fn publish(&self, key: &str, message: T) {
        if let Some(tx) = self.keys().get(key) {
            let _ = tx.send(message);
        }
    }

    /// Sends a copy of `message` to the subscribers of every key.
    pub fn publish_all(&self, message: &T) {
        for tx in self.keys().values() {
            let _ = tx.send(message.clone());
        }
    }

    /// Whether `key` has a subscriber now.
    pub fn has(&self, key: &str) -> bool {
        self.keys().contains_key(key)
    }

    /// Keys with a subscriber now.
    pub fn len(&self) -> usize {
        self.keys().len()
    }

    /// Whether no key has a subscriber.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One subscriber's messages of a key; the key is forgotten with its last
/// subscriber.
pub struct Subscription<T> {
    topics: Arc<Topics<T>>,
    key: String,
    /// Taken (and dropped under the lock) when the subscription ends.
    receiver: Option<broadcast::Receiver<T>>,
}

impl<T: Clone> Subscription<T> {
    /// The next message (`Err(n)`: `n` were missed by falling behind);
    /// `None` never comes while the topics live.
    pub async fn recv(&mut self) -> Option<Result<T, u64>> {
        match self.receiver.as_mut()?.recv().await {
            Ok(message) => Some(Ok(message)),
            Err(broadcast::error::RecvError::Lagged(missed)) => Some(Err(missed)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

impl<T> Drop for Subscription<T> {
    fn drop(&mut self) {
        let mut keys = self
            .topics
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The receiver goes under the lock: of two subscriptions ending at
        // once, the second sees the first gone, and the key leaves.
        drop(self.receiver.take());
        if keys
            .get(&self.key)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            keys.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_reach_their_keys_subscribers_and_a_key_leaves_with_its_last() {
        let topics = Topics::new(4);
        let mut first = topics.subscribe("a");
        let second = topics.subscribe("a");
        let mut other = topics.subscribe("b");
        assert_eq!(topics.len(), 2);
        topics.publish("a", 1);
        topics.publish("b", 2);
        assert_eq!(first.recv().await, Some(Ok(1)));
        assert_eq!(other.recv().await, Some(Ok(2)));
        topics.publish_all(&3);
        assert_eq!(first.recv().await, Some(Ok(3)));
        assert_eq!(other.recv().await, Some(Ok(3)));
        drop(second);
        assert_eq!(topics.len(), 2, "a still has a subscriber");
        drop(first);
        assert_eq!(topics.len(), 1);
        // Nobody follows a: nothing is kept for it.
        topics.publish("a", 4);
        assert_eq!(topics.len(), 1);
        drop(other);
        assert!(topics.is_empty());
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_learns_how_much_it_missed() {
        let topics = Topics::new(2);
        let mut slow = topics.subscribe("a");
        for i in 0..5 {
            topics.publish("a", i);
        }
        assert_eq!(slow.recv().await, Some(Err(3)));
        assert_eq!(slow.recv().await, Some(Ok(3)));
    }
}

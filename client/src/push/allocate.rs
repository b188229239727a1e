//! Which queues of a topic each member of a clustering group consumes: RocketMQ's
//! `AllocateMessageQueueAveragely`.
//!
//! Owns the arithmetic only: every member sorts the same queues and the same client ids and
//! computes its own share, so the members agree without talking to each other. Never: asking
//! anyone for the member list or the queues.

use crate::route::MessageQueue;

/// The queues `client_id` consumes when the members `client_ids` share `queues`. Both lists
/// are sorted here; with `q` queues and `c` members, member `i` (in sorted order) gets `q / c`
/// consecutive queues, and one more when `i < q % c`: 8 queues over 3 members give 3, 3, 2.
/// Members beyond the queue count get none. A client not in the list gets none (its heartbeat
/// has not reached the broker yet; the membership notice that follows triggers a rebalance).
#[must_use]
pub fn allocate_averagely(
    queues: &[MessageQueue],
    client_ids: &[String],
    client_id: &str,
) -> Vec<MessageQueue> {
    let mut queues = queues.to_vec();
    queues.sort();
    queues.dedup();
    let mut client_ids = client_ids.to_vec();
    client_ids.sort();
    client_ids.dedup();
    let Some(index) = client_ids.iter().position(|id| id == client_id) else {
        return Vec::new();
    };
    let (start, count) = share(queues.len(), client_ids.len(), index);
    queues.into_iter().skip(start).take(count).collect()
}

/// The first index and the number of queues that member `index` of `members` gets out of
/// `queue_count`.
fn share(queue_count: usize, members: usize, index: usize) -> (usize, usize) {
    debug_assert!(index < members);
    let base = queue_count / members;
    let extra = queue_count % members;
    if index < extra {
        (index * (base + 1), base + 1)
    } else {
        (index * base + extra, base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(count: u32) -> Vec<MessageQueue> {
        (0..count)
            .map(|id| MessageQueue::new("t", "broker-a", id))
            .collect()
    }

    fn clients(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("10.0.0.1@{i}")).collect()
    }

    fn shares(queue_count: u32, client_count: usize) -> Vec<Vec<u32>> {
        let queues = queues(queue_count);
        let clients = clients(client_count);
        clients
            .iter()
            .map(|client| {
                allocate_averagely(&queues, &clients, client)
                    .into_iter()
                    .map(|queue| queue.queue_id)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn eight_queues_three_members_get_three_three_two() {
        assert_eq!(shares(8, 3), vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7]]);
    }

    #[test]
    fn eight_queues_two_members_split_four_four() {
        assert_eq!(shares(8, 2), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    }

    #[test]
    fn more_members_than_queues_leaves_some_idle() {
        assert_eq!(shares(2, 3), vec![vec![0], vec![1], vec![]]);
        assert_eq!(shares(0, 2), vec![Vec::<u32>::new(), vec![]]);
    }

    #[test]
    fn every_queue_goes_to_exactly_one_member() {
        for queue_count in 0..20 {
            for client_count in 1..8 {
                let mut all: Vec<u32> = shares(queue_count, client_count).concat();
                all.sort_unstable();
                assert_eq!(all, (0..queue_count).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn input_order_does_not_matter() {
        let mut shuffled = queues(8);
        shuffled.reverse();
        let mut members = clients(3);
        members.reverse();
        let mine = allocate_averagely(&shuffled, &members, "10.0.0.1@0");
        assert_eq!(
            mine.iter().map(|q| q.queue_id).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn an_unknown_client_gets_nothing() {
        assert!(allocate_averagely(&queues(8), &clients(2), "stranger").is_empty());
    }

    #[test]
    fn queues_sort_by_broker_then_id() {
        let mixed = vec![
            MessageQueue::new("t", "broker-b", 0),
            MessageQueue::new("t", "broker-a", 1),
            MessageQueue::new("t", "broker-a", 0),
        ];
        let clients = clients(1);
        let all = allocate_averagely(&mixed, &clients, &clients[0]);
        let names: Vec<String> = all.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["t@broker-a#0", "t@broker-a#1", "t@broker-b#0"]);
    }
}

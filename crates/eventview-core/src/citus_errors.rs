//! What Citus's errors say: the node a connection error names.

/// The node (host, port) a Citus connection error names, as Citus words it: "connection to the
/// remote node <user>@<host>:<port> failed with the following error: ...". None for another
/// wording.
pub fn remote_node_named(message: &str) -> Option<(String, i32)> {
    let rest = &message[message.find("remote node ")? + "remote node ".len()..];
    let address = rest.split_whitespace().next()?;
    let address = address.rsplit_once('@').map_or(address, |(_, a)| a);
    let (host, port) = address.rsplit_once(':')?;
    let port = port.parse::<i32>().ok()?;
    (!host.is_empty()).then(|| (host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_of_a_connection_error_is_read_from_its_message() {
        assert_eq!(
            remote_node_named(
                "connection to the remote node postgres@127.0.0.1:55612 failed with the following error: Connection refused"
            ),
            Some(("127.0.0.1".to_string(), 55612))
        );
        assert_eq!(
            remote_node_named("connection to the remote node db-2.internal:5432 failed"),
            Some(("db-2.internal".to_string(), 5432))
        );
        assert_eq!(
            remote_node_named("connection to the remote node app@user@[::1]:6432 failed"),
            Some(("[::1]".to_string(), 6432))
        );
        assert_eq!(
            remote_node_named("terminating connection due to administrator command"),
            None
        );
        assert_eq!(
            remote_node_named("connection to the remote node localhost failed"),
            None
        );
        assert_eq!(
            remote_node_named("connection to the remote node :5432 failed"),
            None
        );
    }
}

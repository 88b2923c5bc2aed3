// PostgreSQL under Patroni for the lab: a one-node etcd, two Patroni nodes
// (a primary and a synchronous standby) on loopback ports, config rendered
// from tests/scaleout/patroni.yml. Everything is killed on destruction.
#pragma once

#include "harness.hpp"
#include "procs.hpp"

#include <memory>
#include <string>
#include <vector>

namespace im::scaleout {

class PatroniCluster {
public:
    explicit PatroniCluster(const std::string& config_dir);
    ~PatroniCluster();
    /// postgresql://…host1,host2/im?target_session_attrs=read-write
    std::string url() const;
    /// Direct URL of node i (no failover), for probes.
    std::string node_url(std::size_t i, const std::string& db = "im") const;
    /// Index of the node that is primary now (not in recovery), if any.
    std::optional<std::size_t> primary() const;
    /// True when the primary reports a synchronous standby streaming.
    bool has_sync_standby() const;
    /// True when Patroni on node i says it is the synchronous standby (REST
    /// GET /sync): only such a node is promoted in synchronous_mode.
    bool is_sync_standby(std::size_t i) const;
    /// SIGKILL node i: its Patroni and every PostgreSQL process of it.
    void kill_node(std::size_t i);
    /// Starts the killed node i's Patroni again on its data directory: it
    /// rejoins as a standby of the current primary (pg_rewind if needed).
    void restart_node(std::size_t i);
    std::string log_tail(std::size_t i) const;
    std::string patroni_yml(std::size_t i) const;

private:
    struct Node {
        std::string name, dir;
        unsigned short pg_port = 0, rest_port = 0;
        std::unique_ptr<Proc> patroni;
    };
    void start_node(Node& n, const std::string& config_dir);
    void kill_postgres(const Node& n);

    test::TempDir dir_;
    std::string config_dir_, scope_;
    unsigned short etcd_client_ = 0, etcd_peer_ = 0;
    std::unique_ptr<Proc> etcd_;
    std::vector<Node> nodes_;
};

} // namespace im::scaleout

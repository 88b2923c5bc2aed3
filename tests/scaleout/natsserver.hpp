// A nats-server for the lab's NATS bus, on free loopback ports, config
// rendered from tests/scaleout/nats.conf. restart() keeps the port, as a
// real server coming back would.
#pragma once

#include "harness.hpp"
#include "procs.hpp"

#include <memory>
#include <string>

namespace im::scaleout {

class NatsServer {
public:
    explicit NatsServer(const std::string& config_dir);
    std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }
    /// What a deployment passes to --bus: every node of a NATS cluster. Here
    /// a node that is down (a loopback port nobody listens on) first, then
    /// this server: a bus that took the list as one URL never connects.
    std::string cluster_url() const { return "nats://127.0.0.1:" + std::to_string(dead_port_) + "," + url(); }
    /// SIGKILL, then start again on the same port and wait until healthy.
    void restart();
    /// SIGKILL (the bus is down until start()).
    void stop();
    /// Starts on the same port and waits until healthy.
    void start();

private:
    test::TempDir dir_;
    unsigned short port_ = 0, http_port_ = 0, dead_port_ = 0;
    std::unique_ptr<Proc> proc_;
};

} // namespace im::scaleout

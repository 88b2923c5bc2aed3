// Process plumbing of the scale-out lab: daemons it starts (HAProxy, etcd,
// Patroni, NATS, SDK clients), free loopback ports, config templates, a
// plain HTTP GET. Every process started here dies with the lab.
#pragma once

#include "harness.hpp"

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace im::scaleout {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A loopback TCP port reserved for the run, and the wait that throws with
// what it waited for: the shared ones (tests/support/harness.hpp).
using test::free_port;
using test::wait_until;

/// Reads a template, replaces every @KEY@ by vars[KEY], writes it to out.
void render(const std::string& template_path, const std::string& out, const std::map<std::string, std::string>& vars);

/// Plain HTTP/1.1 GET on 127.0.0.1:port; nothing when the connection fails.
std::optional<std::pair<int, std::string>> http_get(unsigned short port, const std::string& target,
                                                    std::chrono::milliseconds timeout = 2s);

/// True when we are root and PostgreSQL tools must run as `postgres`.
bool drop_to_postgres();
/// chown -R to the postgres account when drop_to_postgres().
void give_to_postgres(const std::string& path);

/// A child process with stdout+stderr in a log file, in its own process
/// group, killed (SIGKILL) with the lab (PR_SET_PDEATHSIG) and on destruction.
class Proc {
public:
    /// stdout_path: stdout goes there instead of the log (a fact stream).
    Proc(std::vector<std::string> argv, std::string log_path, bool as_postgres = false,
         const std::string& stdout_path = {});
    ~Proc();
    Proc(const Proc&) = delete;
    pid_t pid() const { return pid_; }
    bool running();
    void signal(int sig);
    /// Reaps the process if it exited within `wait`; returns its status.
    std::optional<int> wait_exit(std::chrono::milliseconds wait);
    void kill(); // SIGKILL the group and reap
    std::string log_path() const { return log_; }
    std::string log_tail(std::size_t n = 1500) const;

private:
    pid_t pid_ = -1;
    std::string log_;
};

/// Lines of a text file (a client's stdout) read so far.
std::vector<std::string> read_lines(const std::string& path);

} // namespace im::scaleout

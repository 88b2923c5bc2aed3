// The gateway's LISTEN side: one thread with its own connection receives the
// commit notifications of every gateway, reads the rows itself, and fans the
// frames out to this gateway's subscribed connections. When the listening
// connection is lost and comes back, every subscriber gets `resync`.
#pragma once

#include "metrics.hpp"
#include "gateway.hpp"
#include "store.hpp"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace im {

class Notifier {
public:
    Notifier(std::string url, std::shared_ptr<Gateway> gw, Store& store, Metrics& metrics);
    ~Notifier();
    void start();
    void stop();

private:
    void run();
    void process(pqxx::connection_base& c, const std::vector<std::string>& payloads);

    std::string url_;
    std::shared_ptr<Gateway> gw_;
    Store& store_;
    Metrics& metrics_;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

} // namespace im

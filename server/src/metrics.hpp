// Counters for GET /metrics (Prometheus text format).
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace im {

class Metrics {
public:
    std::atomic<long long> connections{0};        // open WebSocket connections
    std::atomic<long long> connections_total{0};
    std::atomic<long long> pushes_event{0};
    std::atomic<long long> pushes_hint{0};
    std::atomic<long long> pushes_resync{0};
    std::atomic<long long> notify_lag_ms{0};      // last commit -> gateway delay seen
    std::atomic<long long> listen_reconnects{0};
    std::atomic<long long> send_transactions{0};  // database transactions that carried sends

    /// code is "OK" for success replies.
    void count_request(std::string_view type, std::string_view code);
    void observe_send_seconds(double s);
    std::string render(std::size_t pool_in_use, std::size_t pool_size, std::size_t pool_queued) const;

private:
    static constexpr std::array<double, 10> bounds_{0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5};
    mutable std::mutex mu_;
    std::map<std::pair<std::string, std::string>, long long> requests_;
    std::array<long long, bounds_.size()> send_buckets_{};
    long long send_count_ = 0;
    double send_sum_ = 0;
};

} // namespace im

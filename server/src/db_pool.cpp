#include "db_pool.hpp"

#include "log.hpp"

#include <pqxx/pqxx>

#include <chrono>

namespace im {

std::unique_ptr<pqxx::connection> open_connection(const std::string& url, const std::string& app_name) {
    // A short connect timeout: a lost database must turn into UNAVAILABLE
    // quickly, never into a hung request.
    std::string full = url;
    if (url.find("://") != std::string::npos) full += (url.find('?') == std::string::npos ? "?" : "&");
    else full += " ";
    full += "connect_timeout=3";
    auto c = std::make_unique<pqxx::connection>(full);
    pqxx::nontransaction tx(*c);
    tx.exec("SET application_name = " + tx.quote(app_name));
    tx.exec("SET statement_timeout = '30s'");
    tx.exec("SET lock_timeout = '10s'");
    return c;
}

DbPool::DbPool(std::string url, std::size_t workers, std::size_t max_queue)
    : url_(std::move(url)), max_queue_(max_queue) {
    for (std::size_t i = 0; i < workers; ++i) threads_.emplace_back([this, i] { run(i); });
}

DbPool::~DbPool() { stop(); }

bool DbPool::submit(Job job) {
    {
        std::lock_guard lk(mu_);
        if (stopping_ || jobs_.size() >= max_queue_) return false;
        jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
    return true;
}

std::size_t DbPool::queued() const {
    std::lock_guard lk(mu_);
    return jobs_.size();
}

void DbPool::stop() {
    {
        std::lock_guard lk(mu_);
        if (stopping_ && threads_.empty()) return;
        stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
        if (t.joinable()) t.join();
    threads_.clear();
}

void DbPool::run(std::size_t index) {
    std::unique_ptr<pqxx::connection> conn;
    auto retry_after = std::chrono::steady_clock::time_point{};
    for (;;) {
        Job job;
        {
            std::unique_lock lk(mu_);
            cv_.wait(lk, [this] { return stopping_ || !jobs_.empty(); });
            if (jobs_.empty()) return; // stopping and drained
            job = std::move(jobs_.front());
            jobs_.pop_front();
        }
        ++busy_;
        if (conn && !conn->is_open()) conn.reset();
        if (!conn && std::chrono::steady_clock::now() >= retry_after) {
            try {
                conn = open_connection(url_, "imserver-pool-" + std::to_string(index));
            } catch (const std::exception& e) {
                // Don't let every queued job wait for a connect timeout.
                retry_after = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
                log_warn("db_connect_failed", {{"worker", static_cast<int>(index)}, {"err", e.what()}});
            }
        }
        try {
            job(conn.get());
        } catch (const std::exception& e) {
            log_error("db_job_failed", {{"err", e.what()}});
        }
        if (conn && !conn->is_open()) conn.reset();
        --busy_;
    }
}

} // namespace im

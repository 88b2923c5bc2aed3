#include "natsserver.hpp"

namespace im::scaleout {

NatsServer::NatsServer(const std::string& config_dir) : dir_("imnats") {
    port_ = free_port();
    http_port_ = free_port();
    dead_port_ = free_port();
    render(config_dir + "/nats.conf", dir_.path() + "/nats.conf",
           {{"PORT", std::to_string(port_)}, {"HTTP_PORT", std::to_string(http_port_)}});
    start();
}

void NatsServer::start() {
    proc_ = std::make_unique<Proc>(std::vector<std::string>{"nats-server", "-c", dir_.path() + "/nats.conf"},
                                   dir_.path() + "/nats.log");
    try {
        wait_until(
            [&] {
                auto r = http_get(http_port_, "/healthz");
                return r && r->first == 200;
            },
            60s, "nats-server to be healthy");
    } catch (const std::exception& e) {
        throw std::runtime_error(std::string(e.what()) + "\n" + proc_->log_tail());
    }
}

void NatsServer::restart() {
    stop();
    start();
}

void NatsServer::stop() { proc_->kill(); }

} // namespace im::scaleout

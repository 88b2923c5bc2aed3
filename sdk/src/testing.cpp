#include <im/testing.h>

#include "client_p.h"

namespace im::testing {

Faults::Faults(Client *client, QObject *parent) : QObject(parent), client_(client) {
    if (client)
        connect(&ClientPrivate::get(client)->conn, &Connection::offlineChanged, this, &Faults::offlineChanged);
}

Faults::~Faults() = default;

Client *Faults::client() const { return client_; }

bool Faults::isOffline() const { return client_ && ClientPrivate::get(client_)->conn.isOffline(); }

void Faults::setOffline(bool offline) {
    if (client_)
        ClientPrivate::get(client_)->conn.setOffline(offline);
}

void Faults::dropNextReply() {
    if (client_)
        ClientPrivate::get(client_)->conn.dropNextReply();
}

void Faults::closeSocketNow() {
    if (client_)
        ClientPrivate::get(client_)->conn.closeSocketNow();
}

} // namespace im::testing

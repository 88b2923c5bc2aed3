#include <im/presencewatch.h>

#include "client_p.h"
#include "clientlink_p.h"

#include <QtCore/QPointer>

namespace im {

class PresenceWatchPrivate {
public:
    QPointer<Client> client;
    QList<QMetaObject::Connection> links;
    QStringList users;
    bool watching = false; ///< users are counted in the client's watch list

    Ephemeral *ephemeral() const { return client ? &ClientPrivate::get(client.data())->ephemeral : nullptr; }
    void start() {
        if (Ephemeral *e = ephemeral(); e && !watching && !users.isEmpty()) {
            e->watch(users);
            watching = true;
        }
    }
    void stop() {
        if (Ephemeral *e = ephemeral(); e && watching)
            e->unwatch(users);
        watching = false;
    }
    std::optional<proto::PresenceState> state(const QString &user) const {
        if (const Ephemeral *e = ephemeral(); e && users.contains(user))
            return e->presence(user);
        return std::nullopt;
    }
};

PresenceWatch::PresenceWatch(QObject *parent) : QObject(parent), d(std::make_unique<PresenceWatchPrivate>()) {}

PresenceWatch::PresenceWatch(Client *client, const QStringList &users, QObject *parent) : PresenceWatch(parent) {
    setUsers(users);
    setClient(client);
}

PresenceWatch::~PresenceWatch() { d->stop(); }

Client *PresenceWatch::client() const { return d->client.data(); }

void PresenceWatch::setClient(Client *client) {
    if (client == d->client && (client || d->links.isEmpty()))
        return;
    d->stop();
    detail::relink(d->client, d->links, client);
    if (client) {
        ClientPrivate *cp = ClientPrivate::get(client);
        d->links << connect(&cp->ephemeral, &Ephemeral::presenceChanged, this, [this](const QStringList &users) {
            bool mine = false;
            for (const QString &u : users)
                if (d->users.contains(u)) {
                    mine = true;
                    emit userPresenceChanged(u);
                }
            if (mine)
                emit presenceChanged();
        });
        d->links << connect(cp, &ClientPrivate::aboutToBeDestroyed, this, [this] { setClient(nullptr); });
        d->start();
    }
    emit clientChanged();
    emit presenceChanged();
}

QStringList PresenceWatch::users() const { return d->users; }

void PresenceWatch::setUsers(const QStringList &users) {
    QStringList unique;
    for (const QString &u : users)
        if (!u.isEmpty() && !unique.contains(u))
            unique.append(u);
    if (unique == d->users)
        return;
    d->stop();
    d->users = unique;
    d->start();
    emit usersChanged();
    emit presenceChanged();
}

bool PresenceWatch::isOnline(const QString &user) const {
    const auto s = d->state(user);
    return s && s->online;
}

QDateTime PresenceWatch::lastSeenOf(const QString &user) const {
    const auto s = d->state(user);
    return s && s->lastSeen > 0 ? QDateTime::fromMSecsSinceEpoch(s->lastSeen) : QDateTime();
}

bool PresenceWatch::isKnown(const QString &user) const { return d->state(user).has_value(); }

bool PresenceWatch::isOnline() const {
    for (const QString &u : std::as_const(d->users))
        if (isOnline(u))
            return true;
    return false;
}

QDateTime PresenceWatch::lastSeen() const {
    QDateTime latest;
    for (const QString &u : std::as_const(d->users)) {
        const QDateTime t = lastSeenOf(u);
        if (t.isValid() && (!latest.isValid() || t > latest))
            latest = t;
    }
    return latest;
}

QStringList PresenceWatch::onlineUsers() const {
    QStringList out;
    for (const QString &u : std::as_const(d->users))
        if (isOnline(u))
            out.append(u);
    out.sort();
    return out;
}

bool PresenceWatch::isKnown() const {
    for (const QString &u : std::as_const(d->users))
        if (isKnown(u))
            return true;
    return false;
}

} // namespace im

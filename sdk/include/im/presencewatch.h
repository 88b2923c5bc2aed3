// im::PresenceWatch: who of some users is online, and when they were last
// seen (contract section 13, obligation 19), as properties a view binds.
#pragma once

#include <im/client.h>
#include <im/global.h>

#include <QtCore/QDateTime>
#include <QtCore/QObject>
#include <QtCore/QStringList>

#include <memory>

namespace im {

class PresenceWatchPrivate;

/**
 * Watches the presence of `users` through `client`: the server answers and
 * then pushes every change of their `online` (within 2 s, across gateways).
 * The watch list is kept across reconnects (asked again after every
 * `welcome` and `resync`); several watches share one list on the
 * connection. Users who never shared a conversation with this user are
 * left out by the server: they stay `known == false`, offline.
 *
 * C++: `auto *w = client.watchPresence({"ben"});` (owned by the client
 * unless you delete it: deleting it ends the watch). QML:
 * `PresenceWatch { client: myClient; users: ["ben"] }`, then
 * `watch.online`, `watch.lastSeen`, `watch.isOnline("ben")`.
 */
class IM_SDK_EXPORT PresenceWatch : public QObject {
    Q_OBJECT
    Q_PROPERTY(im::Client *client READ client WRITE setClient NOTIFY clientChanged)
    /// The users watched (set them from QML, or at construction).
    Q_PROPERTY(QStringList users READ users WRITE setUsers NOTIFY usersChanged)
    /// True if any watched user is online (with one user: that user).
    Q_PROPERTY(bool online READ isOnline NOTIFY presenceChanged)
    /// With one user: when they were last seen (now-ish while online; the
    /// server's time of the answer or push); with several: the latest of
    /// them. Invalid if unknown (not answered yet, a stranger, or never seen
    /// online since the server records presence).
    Q_PROPERTY(QDateTime lastSeen READ lastSeen NOTIFY presenceChanged)
    /// The watched users online now, sorted.
    Q_PROPERTY(QStringList onlineUsers READ onlineUsers NOTIFY presenceChanged)
    /// True once the server gave the presence of any watched user (it
    /// never does for strangers).
    Q_PROPERTY(bool known READ isKnown NOTIFY presenceChanged)
public:
    explicit PresenceWatch(QObject *parent = nullptr);
    PresenceWatch(Client *client, const QStringList &users, QObject *parent = nullptr);
    ~PresenceWatch() override;

    Client *client() const;
    void setClient(Client *client);
    QStringList users() const;
    void setUsers(const QStringList &users);

    bool isOnline() const;
    QDateTime lastSeen() const;
    QStringList onlineUsers() const;
    bool isKnown() const;

    /// Whether `user` (one of users()) is online.
    Q_INVOKABLE bool isOnline(const QString &user) const;
    /// When `user` was last seen; invalid if unknown.
    Q_INVOKABLE QDateTime lastSeenOf(const QString &user) const;
    /// Whether the server gave `user`'s presence (false for strangers and
    /// before the first answer).
    Q_INVOKABLE bool isKnown(const QString &user) const;

Q_SIGNALS:
    void clientChanged();
    void usersChanged();
    /// Any of the properties online, lastSeen, onlineUsers, known may have changed.
    void presenceChanged();
    /// `user`'s presence changed (or was answered).
    void userPresenceChanged(const QString &user);

private:
    std::unique_ptr<PresenceWatchPrivate> d;
};

} // namespace im

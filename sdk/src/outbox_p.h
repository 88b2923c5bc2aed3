// Outbox: the durable queue of send/recall requests and the order in which
// they go on the wire. Owns the in-memory image of the outbox table, the send
// window, and the classification of each request's outcome into a final
// timeline state or a retry.
#pragma once

#include <im/types.h>

#include "codec_p.h"
#include "storage_p.h"

#include <QtCore/QHash>
#include <QtCore/QObject>

#include <map>
#include <optional>

namespace im {

class ClientPrivate;

class Outbox : public QObject {
    Q_OBJECT
public:
    struct Item {
        detail::OutboxRow row;
        bool inFlight = false;
        QString rid;
    };

    explicit Outbox(ClientPrivate &d);

    /// Loads the rows of a freshly opened database (creation order).
    void load(const QList<detail::OutboxRow> &rows);
    void clear();
    /// Commits a send/recall request and queues it; returns its cmid or empty.
    QString enqueue(const QString &kind, const QString &conv, const QString &body, qint64 target);
    /// Makes every entry due now and sends what the window allows.
    void resendPending();
    /// Puts due entries on the wire (session up, window permitting).
    void pump();
    void schedulePump();
    /// Our own events (by cmid) settle their entries, even before the send's
    /// reply arrives (a lost reply, or the event came by sync first).
    void settleOwnEvents(const QList<proto::Event> &events);

    bool contains(const QString &cmid) const { return ids_.contains(cmid); }
    int size() const { return int(items_.size()); }
    const std::map<qint64, Item> &items() const { return items_; }
    int window = 64;

private:
    void onOutcome(const QString &rid, const QString &cmid, const std::optional<proto::Incoming> &reply);

    ClientPrivate &d;
    std::map<qint64, Item> items_; // by outbox row id = creation order
    QHash<QString, qint64> ids_;   // cmid -> row id
    int inFlight_ = 0;
    bool pumpQueued_ = false;
};

} // namespace im

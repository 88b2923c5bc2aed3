#include <im/outboxmodel.h>

#include "clientlink_p.h"
#include <im/client.h>

#include "client_p.h"
#include "modelroles_p.h"

#include <QtCore/QPointer>

#include <algorithm>

namespace im {

// The model keeps only the outbox row ids of its rows (creation order = id
// order) and reads each entry from the client's outbox when a view asks. It
// follows the outbox's row-level notifications: one insert, change or
// removal per entry, never a copy of the whole outbox (docs/sdk.md).
class OutboxModelPrivate {
public:
    explicit OutboxModelPrivate(OutboxModel *qq) : q(qq) {}

    OutboxModel *q;
    QPointer<Client> client;
    QList<qint64> ids; // ascending
    QList<QMetaObject::Connection> links;

    const Outbox *outbox() const { return client ? &ClientPrivate::get(client)->outbox : nullptr; }
    int rowOf(qint64 id) const {
        const auto it = std::lower_bound(ids.cbegin(), ids.cend(), id);
        return it != ids.cend() && *it == id ? int(it - ids.cbegin()) : -1;
    }

    /// Follows `c`'s outbox from now on (nullptr: none) and shows its rows.
    void attach(Client *c) {
        detail::relink(client, links, c);
        if (const Outbox *ob = outbox()) {
            links << QObject::connect(ob, &Outbox::entryAdded, q, [this](qint64 id) { added(id); });
            links << QObject::connect(ob, &Outbox::entryChanged, q, [this](qint64 id) {
                const int row = rowOf(id);
                if (row >= 0)
                    emit q->dataChanged(q->index(row), q->index(row));
            });
            links << QObject::connect(ob, &Outbox::entryAboutToBeRemoved, q, [this](qint64 id) { removed(id); });
            links << QObject::connect(ob, &Outbox::entriesReset, q, &OutboxModel::refresh);
            // The client (and its outbox) goes away: no rows, no client.
            // (A private signal: an app may disconnect() its Client.)
            links << QObject::connect(ClientPrivate::get(c), &ClientPrivate::aboutToBeDestroyed, q, [this] {
                attach(nullptr);
                emit q->clientChanged();
            });
        }
        q->refresh();
    }

    void added(qint64 id) {
        const int row = int(std::lower_bound(ids.cbegin(), ids.cend(), id) - ids.cbegin());
        q->beginInsertRows({}, row, row);
        ids.insert(row, id);
        q->endInsertRows();
        emit q->depthChanged();
    }

    void removed(qint64 id) {
        const int row = rowOf(id);
        if (row < 0)
            return;
        q->beginRemoveRows({}, row, row);
        ids.remove(row);
        q->endRemoveRows();
        emit q->depthChanged();
    }
};

OutboxModel::OutboxModel(Client *client, QObject *parent)
    : QAbstractListModel(parent), d(std::make_unique<OutboxModelPrivate>(this)) {
    d->attach(client);
}

OutboxModel::~OutboxModel() = default;

Client *OutboxModel::client() const { return d->client.data(); }

void OutboxModel::setClient(Client *client) {
    if (client == d->client)
        return;
    d->attach(client);
    emit clientChanged();
}

int OutboxModel::depth() const { return int(d->ids.size()); }

void OutboxModel::refresh() {
    QList<qint64> fresh;
    if (const Outbox *ob = d->outbox()) {
        fresh.reserve(ob->size());
        for (const auto &[id, item] : ob->items())
            fresh.append(id);
    }
    if (fresh == d->ids)
        return;
    const int before = int(d->ids.size());
    beginResetModel();
    d->ids = std::move(fresh);
    endResetModel();
    if (before != int(d->ids.size()))
        emit depthChanged();
}

int OutboxModel::rowCount(const QModelIndex &parent) const { return parent.isValid() ? 0 : int(d->ids.size()); }

QVariant OutboxModel::data(const QModelIndex &index, int role) const {
    if (!index.isValid() || index.row() < 0 || index.row() >= d->ids.size())
        return {};
    const Outbox *ob = d->outbox();
    const Outbox::Item *item = ob ? ob->find(d->ids.at(index.row())) : nullptr;
    if (!item)
        return {};
    const OutboxEntry e = Outbox::toEntry(*item);
    switch (role) {
    case Qt::DisplayRole:
    case CmidRole: return e.cmid();
    case ConvRole: return e.conv();
    case KindRole: return e.kind();
    case BodyRole: return e.body();
    case TargetRole: return e.target();
    case AttemptsRole: return e.attempts();
    case LastErrorRole: return e.lastError();
    case NextRetryAtRole: return e.nextRetryAt();
    case CreatedAtRole: return e.createdAt();
    case InFlightRole: return e.isInFlight();
    case PrevRole: return e.prev();
    case HeldRole: return e.isHeld();
    default: return {};
    }
}

QVariant OutboxModel::get(int row, int role) const { return data(index(row), role); }

QVariant OutboxModel::get(int row, const QString &roleName) const { return detail::valueByRoleName(this, row, roleName); }

QVariantMap OutboxModel::get(int row) const { return detail::rowByRoleName(this, row); }

QHash<int, QByteArray> OutboxModel::roleNames() const {
    return {{CmidRole, "cmid"},         {ConvRole, "conv"},           {KindRole, "kind"},
            {BodyRole, "body"},         {TargetRole, "target"},       {AttemptsRole, "attempts"},
            {LastErrorRole, "lastError"}, {NextRetryAtRole, "nextRetryAt"}, {CreatedAtRole, "createdAt"},
            {InFlightRole, "inFlight"},   {PrevRole, "prev"},
            {HeldRole, "held"}};
}

} // namespace im

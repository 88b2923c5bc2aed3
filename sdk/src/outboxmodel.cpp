#include <im/outboxmodel.h>

#include <im/client.h>

#include "modelroles_p.h"
#include "rowdiff_p.h"

#include <QtCore/QPointer>
#include <QtCore/QTimer>

namespace im {

namespace {
struct Item {
    OutboxEntry e;
    bool operator==(const Item &o) const {
        return e.cmid == o.e.cmid && e.attempts == o.e.attempts && e.lastError == o.e.lastError
               && e.nextRetryAt == o.e.nextRetryAt && e.inFlight == o.e.inFlight;
    }
};
} // namespace

class OutboxModelPrivate {
public:
    QPointer<Client> client;
    QList<Item> rows;
    QTimer reload;
    QList<QMetaObject::Connection> links; // to the current client
};

OutboxModel::OutboxModel(Client *client, QObject *parent)
    : QAbstractListModel(parent), d(std::make_unique<OutboxModelPrivate>()) {
    d->reload.setSingleShot(true);
    d->reload.setInterval(50);
    connect(&d->reload, &QTimer::timeout, this, &OutboxModel::refresh);
    setClient(client);
    if (!client)
        refresh();
}

OutboxModel::~OutboxModel() = default;

Client *OutboxModel::client() const { return d->client.data(); }

void OutboxModel::setClient(Client *client) {
    if (client == d->client && (client || d->links.isEmpty()))
        return;
    for (const QMetaObject::Connection &c : std::as_const(d->links))
        disconnect(c);
    d->links.clear();
    d->client = client;
    if (client) {
        d->links << connect(client, &Client::outboxChanged, this, [this] {
            if (!d->reload.isActive())
                d->reload.start();
        });
        d->links << connect(client, &QObject::destroyed, this, [this] { setClient(nullptr); });
    }
    refresh();
    emit clientChanged();
}

int OutboxModel::depth() const { return int(d->rows.size()); }

void OutboxModel::refresh() {
    d->reload.stop();
    QList<Item> fresh;
    if (d->client)
        for (const OutboxEntry &e : d->client->outbox())
            fresh.append(Item{e});
    const int before = int(d->rows.size());
    detail::RowDiffOps ops;
    ops.beginRemove = [this](int a, int b) { beginRemoveRows({}, a, b); };
    ops.endRemove = [this] { endRemoveRows(); };
    ops.beginInsert = [this](int a, int b) { beginInsertRows({}, a, b); };
    ops.endInsert = [this] { endInsertRows(); };
    ops.beginReset = [this] { beginResetModel(); };
    ops.endReset = [this] { endResetModel(); };
    ops.changed = [this](int r) { emit dataChanged(index(r), index(r)); };
    detail::applyRowDiff(d->rows, fresh, [](const Item &r) { return r.e.cmid; }, ops);
    if (before != int(d->rows.size()))
        emit depthChanged();
}

int OutboxModel::rowCount(const QModelIndex &parent) const { return parent.isValid() ? 0 : int(d->rows.size()); }

QVariant OutboxModel::data(const QModelIndex &index, int role) const {
    if (!index.isValid() || index.row() < 0 || index.row() >= d->rows.size())
        return {};
    const OutboxEntry &e = d->rows.at(index.row()).e;
    switch (role) {
    case Qt::DisplayRole:
    case CmidRole: return e.cmid;
    case ConvRole: return e.conv;
    case KindRole: return e.kind;
    case BodyRole: return e.body;
    case TargetRole: return e.target;
    case AttemptsRole: return e.attempts;
    case LastErrorRole: return e.lastError;
    case NextRetryAtRole: return e.nextRetryAt;
    case CreatedAtRole: return e.createdAt;
    case InFlightRole: return e.inFlight;
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
            {InFlightRole, "inFlight"}};
}

} // namespace im

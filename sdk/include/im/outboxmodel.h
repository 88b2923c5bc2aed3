// im::OutboxModel: the durable outbox, for QA panels and "sending..." badges.
#pragma once

#include <im/client.h>
#include <im/global.h>
#include <im/types.h>

#include <QtCore/QAbstractListModel>

#include <memory>

namespace im {

class OutboxModelPrivate;

/// The entries still in the durable outbox, in creation order, live: each
/// entry added, changed (attempt, in flight, last error) or removed is one
/// row insert, dataChanged or removal, as it happens (no copy of the whole
/// outbox; the model holds row ids and reads entries on demand).
class IM_SDK_EXPORT OutboxModel : public QAbstractListModel {
    Q_OBJECT
    /// The Client whose database is shown; may be set (or changed) after
    /// construction, as QML does. Without one the model is empty.
    Q_PROPERTY(im::Client *client READ client WRITE setClient NOTIFY clientChanged)
    /// Queue depth (same as Client::pendingCount).
    Q_PROPERTY(int depth READ depth NOTIFY depthChanged)
public:
    enum Roles {
        CmidRole = Qt::UserRole + 1, ///< QString (also Qt::DisplayRole)
        ConvRole,        ///< QString
        KindRole,        ///< QString "send" / "recall"
        BodyRole,        ///< QString
        TargetRole,      ///< qint64 recalled seq
        AttemptsRole,    ///< int times put on the wire
        LastErrorRole,   ///< QString UNAVAILABLE / TIMEOUT / DISCONNECTED
        NextRetryAtRole, ///< QDateTime
        CreatedAtRole,   ///< QDateTime
        InFlightRole,    ///< bool
        PrevRole,        ///< QString the cmid its latest attempt named as `prev` (OutboxEntry::prev)
        HeldRole,        ///< bool held: written as another user, never sent here (Client::isHeld())
    };
    Q_ENUM(Roles)

    explicit OutboxModel(Client *client = nullptr, QObject *parent = nullptr);
    ~OutboxModel() override;

    Client *client() const;
    void setClient(Client *client);

    int depth() const;
    int rowCount(const QModelIndex &parent = QModelIndex()) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QHash<int, QByteArray> roleNames() const override;
    /// Value of `role` (a Roles value) at `row`.
    Q_INVOKABLE QVariant get(int row, int role) const;
    /// Value of the role called `roleName` (a roleNames() name) at `row`.
    Q_INVOKABLE QVariant get(int row, const QString &roleName) const;
    /// Every role of `row` by role name (QML: `model.get(0).cmid`); empty if no such row.
    Q_INVOKABLE QVariantMap get(int row) const;

public Q_SLOTS:
    /// Re-reads the whole outbox (a model reset if it differs). Never needed:
    /// the model follows the outbox row by row.
    void refresh();

Q_SIGNALS:
    void clientChanged();
    void depthChanged();

private:
    friend class OutboxModelPrivate;
    std::unique_ptr<OutboxModelPrivate> d;
};

} // namespace im

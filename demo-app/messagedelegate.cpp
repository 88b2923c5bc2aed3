#include "messagedelegate.h"

#include <QtGui/QMouseEvent>
#include <QtGui/QPainter>
#include <QtGui/QPainterPath>
#include <QtWidgets/QAbstractItemView>
#include <QtWidgets/QApplication>
#include <QtWidgets/QStyle>

namespace {

constexpr int kPad = 4;      // around the cell's content (the plain row: one line + 2 * kPad)
constexpr int kChipPad = 6;  // inside a chip, left and right
constexpr int kChipGap = 4;  // between chips
constexpr int kQuoteBar = 3; // the bar left of a quote

const QColor kQuoteColor(0x55, 0x66, 0x77);
const QColor kQuoteBarColor(0x4a, 0x90, 0xd9);
const QColor kEditedColor(0x80, 0x80, 0x80);
const QColor kPendingColor(0xb0, 0x6a, 0x00);
const QColor kChipFill(0xee, 0xee, 0xee);
const QColor kChipBorder(0xc8, 0xc8, 0xc8);
const QColor kMineFill(0xd6, 0xe8, 0xff);
const QColor kMineBorder(0x2f, 0x74, 0xd0);

} // namespace

MessageDelegate::MessageDelegate(QObject *parent) : QStyledItemDelegate(parent) {}

QString MessageDelegate::chipText(const QVariantMap &reaction) {
    return QStringLiteral("%1 %2").arg(reaction.value(QStringLiteral("emoji")).toString())
        .arg(reaction.value(QStringLiteral("count")).toInt());
}

MessageDelegate::Layout MessageDelegate::layoutFor(const QFont &font, const QRect &cell,
                                                   const QModelIndex &index) const {
    const QFontMetrics fm(font);
    const int lh = fm.height();
    Layout l;
    int y = cell.top() + kPad;
    const int left = cell.left() + kPad, width = qMax(0, cell.width() - 2 * kPad);
    if (!index.data(QuoteRole).toString().isEmpty()) {
        l.quote = QRect(left, y, width, lh);
        y += lh + 2;
    }
    l.body = QRect(left, y, width, lh);
    y += lh + kPad;
    int x = left;
    const QVariantList reactions = index.data(ReactionsRole).toList();
    for (const QVariant &v : reactions) {
        const QVariantMap r = v.toMap();
        const int w = fm.horizontalAdvance(chipText(r)) + 2 * kChipPad;
        l.chips.append({r, QRect(x, y, w, lh + 2)});
        x += w + kChipGap;
    }
    return l;
}

QSize MessageDelegate::sizeHint(const QStyleOptionViewItem &option, const QModelIndex &index) const {
    QStyleOptionViewItem opt = option;
    initStyleOption(&opt, index);
    const QFontMetrics fm(opt.font);
    const Layout l = layoutFor(opt.font, QRect(0, 0, 10000, 0), index);
    int w = fm.horizontalAdvance(opt.text) + 2 * kPad;
    for (const QString &mark : {index.data(EditedMarkRole).toString(), index.data(PendingMarkRole).toString()})
        if (!mark.isEmpty())
            w += fm.horizontalAdvance(QLatin1Char(' ') + mark);
    int h = l.body.bottom() + 1 + kPad;
    if (!l.chips.isEmpty()) {
        h = l.chips.first().second.bottom() + 1 + kPad;
        w = qMax(w, l.chips.last().second.right() + kPad);
    }
    if (!l.quote.isNull())
        w = qMax(w, fm.horizontalAdvance(index.data(QuoteRole).toString()) + 2 * kPad + kQuoteBar + 4);
    return {w, h};
}

void MessageDelegate::paint(QPainter *painter, const QStyleOptionViewItem &option, const QModelIndex &index) const {
    QStyleOptionViewItem opt = option;
    initStyleOption(&opt, index);
    const QString body = opt.text;
    // The background (selection, the model's BackgroundRole) as the style draws it.
    opt.text.clear();
    QStyle *style = opt.widget ? opt.widget->style() : QApplication::style();
    style->drawControl(QStyle::CE_ItemViewItem, &opt, painter, opt.widget);

    const Layout l = layoutFor(opt.font, opt.rect, index);
    const QFontMetrics fm(opt.font);
    const bool selected = opt.state & QStyle::State_Selected;
    const QColor text = selected ? opt.palette.color(QPalette::HighlightedText)
                                 : index.data(Qt::ForegroundRole).isValid()
                                       ? index.data(Qt::ForegroundRole).value<QColor>()
                                       : opt.palette.color(QPalette::Text);
    painter->save();
    painter->setClipRect(opt.rect);
    if (!l.quote.isNull()) {
        painter->fillRect(QRect(l.quote.left(), l.quote.top(), kQuoteBar, l.quote.height()), kQuoteBarColor);
        QFont qf = opt.font;
        qf.setItalic(true);
        painter->setFont(qf);
        painter->setPen(selected ? text : kQuoteColor);
        const QRect r = l.quote.adjusted(kQuoteBar + 4, 0, 0, 0);
        painter->drawText(r, Qt::AlignLeft | Qt::AlignVCenter,
                          QFontMetrics(qf).elidedText(index.data(QuoteRole).toString(), Qt::ElideRight, r.width()));
    }
    // Body, then its marks in their own colours.
    QString marks;
    const QString edited = index.data(EditedMarkRole).toString(), pending = index.data(PendingMarkRole).toString();
    const int marksWidth = (edited.isEmpty() ? 0 : fm.horizontalAdvance(QLatin1Char(' ') + edited))
                           + (pending.isEmpty() ? 0 : fm.horizontalAdvance(QLatin1Char(' ') + pending));
    painter->setFont(opt.font);
    painter->setPen(text);
    const QString shownBody = fm.elidedText(body, Qt::ElideRight, qMax(0, l.body.width() - marksWidth));
    painter->drawText(l.body, Qt::AlignLeft | Qt::AlignVCenter, shownBody);
    int x = l.body.left() + fm.horizontalAdvance(shownBody);
    for (const auto &[mark, color] : {std::pair{edited, kEditedColor}, std::pair{pending, kPendingColor}}) {
        if (mark.isEmpty())
            continue;
        const QString t = QLatin1Char(' ') + mark;
        painter->setPen(selected ? text : color);
        painter->drawText(QRect(x, l.body.top(), fm.horizontalAdvance(t), l.body.height()),
                          Qt::AlignLeft | Qt::AlignVCenter, t);
        x += fm.horizontalAdvance(t);
    }
    // Reaction chips: ours highlighted (blue fill and border, bold count).
    painter->setRenderHint(QPainter::Antialiasing);
    for (const auto &[r, rect] : l.chips) {
        const bool mine = r.value(QStringLiteral("mine")).toBool();
        QPainterPath path;
        path.addRoundedRect(QRectF(rect).adjusted(0.5, 0.5, -0.5, -0.5), rect.height() / 2.0, rect.height() / 2.0);
        painter->fillPath(path, mine ? kMineFill : kChipFill);
        painter->setPen(QPen(mine ? kMineBorder : kChipBorder, mine ? 1.5 : 1.0));
        painter->drawPath(path);
        QFont cf = opt.font;
        cf.setBold(mine);
        painter->setFont(cf);
        painter->setPen(mine ? kMineBorder : QColor(Qt::black));
        painter->drawText(rect, Qt::AlignCenter, chipText(r));
    }
    painter->restore();
}

QRect MessageDelegate::chipRect(const QAbstractItemView *view, const QModelIndex &index, const QString &emoji) const {
    QStyleOptionViewItem opt;
    opt.initFrom(view);
    opt.rect = view->visualRect(index);
    initStyleOption(&opt, index);
    for (const auto &[r, rect] : layoutFor(opt.font, opt.rect, index).chips)
        if (r.value(QStringLiteral("emoji")).toString() == emoji)
            return rect;
    return {};
}

bool MessageDelegate::editorEvent(QEvent *event, QAbstractItemModel *model, const QStyleOptionViewItem &option,
                                  const QModelIndex &index) {
    if (event->type() == QEvent::MouseButtonRelease) {
        const auto *me = static_cast<QMouseEvent *>(event);
        if (me->button() == Qt::LeftButton) {
            QStyleOptionViewItem opt = option;
            initStyleOption(&opt, index);
            for (const auto &[r, rect] : layoutFor(opt.font, opt.rect, index).chips)
                if (rect.contains(me->position().toPoint())) {
                    emit chipClicked(index, r.value(QStringLiteral("emoji")).toString(),
                                     r.value(QStringLiteral("mine")).toBool());
                    return true;
                }
        }
    }
    return QStyledItemDelegate::editorEvent(event, model, option, index);
}

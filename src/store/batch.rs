//! Statements whose inputs are declared as named columns, each once: its
//! SQL (placeholder, type and name), its Rust type and the value bound to it
//! sit on one line, so no column can be bound in another's place. The
//! statement stays a `query!`/`query_as!` literal, checked at compile time
//! against the schema, and a compile-time check holds every column's
//! placeholder to its position in the list.
//!
//! ```text
//! columns_statement!(query_as(ControlRow)
//!     "WITH input AS (SELECT "
//!     each(p in group) {
//!         id: Uuid = "unnest($1::uuid[]) AS id" <- p.lease.session_id,
//!         ...
//!     }
//!     ") UPDATE ..."
//!     one {
//!         running: Status = "$9::text" <- Status::Running,
//!     }
//!     " ..."
//! )
//! ```
//!
//! `each(pattern in iterator) { ... }` binds one array per column, one
//! element per item (Postgres `UNNEST` input, as set-returning calls in a
//! select list: they advance together); `one { ... }` binds one value per
//! column. The columns of a section are written into the SQL separated by
//! commas, between the literal pieces around them.

/// Whether the placeholders of `columns` are `$1`, `$2`, … in list order,
/// one in each: the parameters are bound in list order, so this is what
/// makes each column's value reach its own placeholder.
pub(super) const fn numbered_in_order(columns: &[&str]) -> bool {
    let mut i = 0;
    while i < columns.len() {
        let sql = columns[i].as_bytes();
        let mut at = 0;
        while at < sql.len() && sql[at] != b'$' {
            at += 1;
        }
        at += 1;
        let mut number = 0;
        let mut digits = 0;
        while at < sql.len() && sql[at].is_ascii_digit() {
            number = number * 10 + (sql[at] - b'0') as usize;
            digits += 1;
            at += 1;
        }
        if digits == 0 || number != i + 1 {
            return false;
        }
        while at < sql.len() {
            if sql[at] == b'$' {
                return false;
            }
            at += 1;
        }
        i += 1;
    }
    true
}

/// A `query!` (or `query_as!(Type)`) whose parameters are declared as
/// columns; see the module documentation.
macro_rules! columns_statement {
    (query_as($out:path) $($rest:tt)*) => {
        $crate::store::batch::columns_statement!(
            @sql [] @prep [] @args [] @checks [] @out [$out] $($rest)*
        )
    };
    (query $($rest:tt)*) => {
        $crate::store::batch::columns_statement!(
            @sql [] @prep [] @args [] @checks [] @out [] $($rest)*
        )
    };
    // A literal piece of SQL.
    (@sql [$($sql:tt)*] @prep [$($prep:tt)*] @args [$($arg:tt)*] @checks [$($chk:tt)*]
     @out [$($out:tt)*] $piece:literal $($rest:tt)*) => {
        $crate::store::batch::columns_statement!(
            @sql [$($sql)* + $piece] @prep [$($prep)*] @args [$($arg)*] @checks [$($chk)*]
            @out [$($out)*] $($rest)*
        )
    };
    // One array per column, filled from the items of an iterator.
    (@sql [$($sql:tt)*] @prep [$($prep:tt)*] @args [$($arg:tt)*] @checks [$($chk:tt)*]
     @out [$($out:tt)*]
     each($item:pat in $items:expr) {
         $first:ident: $first_ty:ty = $first_sql:literal <- $first_value:expr
         $(, $col:ident: $ty:ty = $col_sql:literal <- $value:expr)* $(,)?
     }
     $($rest:tt)*) => {
        $crate::store::batch::columns_statement!(
            @sql [$($sql)* + $first_sql $(+ ", " + $col_sql)*]
            @prep [$($prep)*
                let mut $first: Vec<$first_ty> = Vec::new();
                $(let mut $col: Vec<$ty> = Vec::new();)*
                for $item in $items {
                    $first.push($first_value);
                    $($col.push($value);)*
                }
            ]
            @args [$($arg)* &$first as &[$first_ty], $(&$col as &[$ty],)*]
            @checks [$($chk)* $first_sql, $($col_sql,)*]
            @out [$($out)*] $($rest)*
        )
    };
    // One value per column.
    (@sql [$($sql:tt)*] @prep [$($prep:tt)*] @args [$($arg:tt)*] @checks [$($chk:tt)*]
     @out [$($out:tt)*]
     one {
         $first:ident: $first_ty:ty = $first_sql:literal <- $first_value:expr
         $(, $col:ident: $ty:ty = $col_sql:literal <- $value:expr)* $(,)?
     }
     $($rest:tt)*) => {
        $crate::store::batch::columns_statement!(
            @sql [$($sql)* + $first_sql $(+ ", " + $col_sql)*]
            @prep [$($prep)*
                let $first: $first_ty = $first_value;
                $(let $col: $ty = $value;)*
            ]
            @args [$($arg)* $first as $first_ty, $($col as $ty,)*]
            @checks [$($chk)* $first_sql, $($col_sql,)*]
            @out [$($out)*] $($rest)*
        )
    };
    // Done: the statement, with every column bound in list order.
    (@sql [+ $($sql:tt)*] @prep [$($prep:tt)*] @args [$($arg:tt)*] @checks [$($chk:tt)*]
     @out [$($out:tt)*]) => {{
        const _: () = assert!(
            $crate::store::batch::numbered_in_order(&[$($chk)*]),
            "each column's placeholder must be its position in the list ($1, $2, ...)"
        );
        $($prep)*
        $crate::store::batch::columns_statement!(@run [$($out)*] [$($sql)*] [$($arg)*])
    }};
    (@run [] [$($sql:tt)*] [$($arg:tt)*]) => {
        sqlx::query!($($sql)*, $($arg)*)
    };
    (@run [$out:path] [$($sql:tt)*] [$($arg:tt)*]) => {
        sqlx::query_as!($out, $($sql)*, $($arg)*)
    };
}

pub(crate) use columns_statement;

#[cfg(test)]
mod tests {
    use super::numbered_in_order;

    #[test]
    fn placeholders_must_follow_the_list() {
        assert!(numbered_in_order(&[]));
        assert!(numbered_in_order(&[
            "unnest($1::uuid[]) AS id",
            "$2::text",
            "unnest($3::int[]) AS n"
        ]));
        assert!(!numbered_in_order(&["$2::text", "$1::text"]));
        assert!(!numbered_in_order(&["$1::text", "$3::text"]));
        assert!(!numbered_in_order(&["$1::text", "no placeholder"]));
        assert!(!numbered_in_order(&["$1::text AND $2::text"]));
        assert!(!numbered_in_order(&["$12::text"]));
    }
}

//! Splits an expression's source into tokens, following the token rules of RocketMQ's
//! `SelectorParser.jj`.
//!
//! Input: the whole source (already checked against `MAX_EXPRESSION_BYTES`). Output: the tokens
//! with their byte offsets, ending with [`TokenKind::End`], or the first lexical error. Literal
//! values are not interpreted here (the parser does that, since a literal's meaning can be an
//! error RocketMQ reports at parse time); string literals are decoded, as their quotes are a
//! lexical matter.

use crate::ParseError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keyword {
    Not,
    And,
    Or,
    Between,
    In,
    True,
    False,
    Null,
    Is,
    Contains,
    StartsWith,
    EndsWith,
}

impl Keyword {
    /// The keyword an identifier spells, in any case (RocketMQ's keywords are `IGNORE_CASE`).
    fn of(word: &str) -> Option<Keyword> {
        const KEYWORDS: [(&str, Keyword); 12] = [
            ("NOT", Keyword::Not),
            ("AND", Keyword::And),
            ("OR", Keyword::Or),
            ("BETWEEN", Keyword::Between),
            ("IN", Keyword::In),
            ("TRUE", Keyword::True),
            ("FALSE", Keyword::False),
            ("NULL", Keyword::Null),
            ("IS", Keyword::Is),
            ("CONTAINS", Keyword::Contains),
            ("STARTSWITH", Keyword::StartsWith),
            ("ENDSWITH", Keyword::EndsWith),
        ];
        KEYWORDS
            .iter()
            .find(|(spelling, _)| spelling.eq_ignore_ascii_case(word))
            .map(|(_, keyword)| *keyword)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TokenKind {
    Keyword(Keyword),
    Identifier,
    /// `0 | [1-9][0-9]*` with an optional `l`/`L` suffix.
    Integer,
    /// `5.`, `5.5`, `.5`, `5E10`, `5.5e-3`: digits with a point or an exponent.
    Float,
    /// The decoded text of a quoted string (`''` stands for one quote).
    Str(String),
    Equal,
    NotEqual,
    Greater,
    GreaterOrEqual,
    Less,
    LessOrEqual,
    LeftParenthesis,
    RightParenthesis,
    Comma,
    Plus,
    Minus,
    End,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token<'s> {
    pub(crate) kind: TokenKind,
    /// The source text of the token (empty for [`TokenKind::End`]).
    pub(crate) text: &'s str,
    /// Byte offset of the token's first character.
    pub(crate) start: usize,
}

impl Token<'_> {
    /// How an error message names this token.
    pub(crate) fn describe(&self) -> String {
        match self.kind {
            TokenKind::End => "the end of the expression".to_owned(),
            TokenKind::Str(_) => format!("string {}", self.text),
            TokenKind::Identifier => format!("property {}", self.text),
            TokenKind::Keyword(_) => format!("keyword {}", self.text.to_ascii_uppercase()),
            _ => format!("'{}'", self.text),
        }
    }
}

pub(crate) fn tokenize(source: &str) -> Result<Vec<Token<'_>>, ParseError> {
    let mut lexer = Lexer {
        source,
        bytes: source.as_bytes(),
        index: 0,
    };
    let mut tokens = Vec::new();
    loop {
        lexer.skip_blanks_and_comments()?;
        let token = lexer.next_token()?;
        let is_end = token.kind == TokenKind::End;
        tokens.push(token);
        if is_end {
            return Ok(tokens);
        }
    }
}

struct Lexer<'s> {
    source: &'s str,
    bytes: &'s [u8],
    index: usize,
}

impl<'s> Lexer<'s> {
    fn peek(&self, ahead: usize) -> Option<u8> {
        self.bytes.get(self.index + ahead).copied()
    }

    fn error(&self, start: usize, message: impl Into<String>) -> ParseError {
        ParseError::at_byte(self.source, start, message)
    }

    /// Blanks are space, tab, CR, LF and form feed; comments are `-- ...` to the end of the
    /// line (or of the expression) and `/* ... */`.
    fn skip_blanks_and_comments(&mut self) -> Result<(), ParseError> {
        loop {
            match (self.peek(0), self.peek(1)) {
                (Some(b' ' | b'\t' | b'\n' | b'\r' | b'\x0c'), _) => self.index += 1,
                (Some(b'-'), Some(b'-')) => {
                    while !matches!(self.peek(0), None | Some(b'\n' | b'\r')) {
                        self.index += 1;
                    }
                }
                (Some(b'/'), Some(b'*')) => {
                    let start = self.index;
                    match self.source[start + 2..].find("*/") {
                        Some(length) => self.index = start + 2 + length + 2,
                        None => return Err(self.error(start, "unterminated comment: no */")),
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    fn next_token(&mut self) -> Result<Token<'s>, ParseError> {
        let start = self.index;
        let Some(first) = self.peek(0) else {
            return Ok(Token {
                kind: TokenKind::End,
                text: "",
                start,
            });
        };
        let kind = match first {
            b'\'' => self.string()?,
            b'0'..=b'9' => self.number()?,
            b'.' if self.peek(1).is_some_and(|next| next.is_ascii_digit()) => self.number()?,
            b'a'..=b'z' | b'A'..=b'Z' | b'_' | b'$' => {
                while self
                    .peek(0)
                    .is_some_and(|next| next.is_ascii_alphanumeric() || matches!(next, b'_' | b'$'))
                {
                    self.index += 1;
                }
                Keyword::of(&self.source[start..self.index])
                    .map_or(TokenKind::Identifier, TokenKind::Keyword)
            }
            _ => self.operator()?,
        };
        Ok(Token {
            kind,
            text: &self.source[start..self.index],
            start,
        })
    }

    fn operator(&mut self) -> Result<TokenKind, ParseError> {
        let (kind, length) = match (self.peek(0), self.peek(1)) {
            (Some(b'<'), Some(b'>')) => (TokenKind::NotEqual, 2),
            (Some(b'<'), Some(b'=')) => (TokenKind::LessOrEqual, 2),
            (Some(b'>'), Some(b'=')) => (TokenKind::GreaterOrEqual, 2),
            (Some(b'<'), _) => (TokenKind::Less, 1),
            (Some(b'>'), _) => (TokenKind::Greater, 1),
            (Some(b'='), _) => (TokenKind::Equal, 1),
            (Some(b'('), _) => (TokenKind::LeftParenthesis, 1),
            (Some(b')'), _) => (TokenKind::RightParenthesis, 1),
            (Some(b','), _) => (TokenKind::Comma, 1),
            (Some(b'+'), _) => (TokenKind::Plus, 1),
            (Some(b'-'), _) => (TokenKind::Minus, 1),
            _ => {
                let character = self.source[self.index..].chars().next().unwrap_or('?');
                return Err(self.error(self.index, format!("unexpected character {character:?}")));
            }
        };
        self.index += length;
        Ok(kind)
    }

    /// `'...'` with `''` for a quote; may span lines.
    fn string(&mut self) -> Result<TokenKind, ParseError> {
        let start = self.index;
        self.index += 1;
        let mut text = String::new();
        loop {
            let rest = &self.source[self.index..];
            let Some(quote) = rest.find('\'') else {
                return Err(self.error(start, "unterminated string: no closing quote"));
            };
            text.push_str(&rest[..quote]);
            self.index += quote + 1;
            if self.peek(0) == Some(b'\'') {
                text.push('\'');
                self.index += 1;
            } else {
                return Ok(TokenKind::Str(text));
            }
        }
    }

    fn skip_digits(&mut self) -> usize {
        let start = self.index;
        while self.peek(0).is_some_and(|next| next.is_ascii_digit()) {
            self.index += 1;
        }
        self.index - start
    }

    /// The longest of RocketMQ's number tokens at this point.
    fn number(&mut self) -> Result<TokenKind, ParseError> {
        let start = self.index;
        let integer_digits = self.skip_digits();
        let mut is_float = false;
        if self.peek(0) == Some(b'.') {
            self.index += 1;
            self.skip_digits();
            is_float = true;
        }
        if self.exponent_length() > 0 {
            self.index += self.exponent_length();
            is_float = true;
        }
        if is_float {
            return Ok(TokenKind::Float);
        }
        // RocketMQ dropped ActiveMQ's octal and hexadecimal literals: "0" is the only integer
        // that starts with 0, and "007" would be three tokens its parser then rejects.
        if integer_digits > 1 && self.bytes[start] == b'0' {
            return Err(self.error(
                start,
                "an integer cannot start with 0 (there are no octal or hexadecimal literals)",
            ));
        }
        if integer_digits > 0
            && self.bytes[start] != b'0'
            && matches!(self.peek(0), Some(b'l' | b'L'))
        {
            self.index += 1;
        }
        Ok(TokenKind::Integer)
    }

    /// The length of an exponent (`e`, optional sign, digits) at this point, or 0.
    fn exponent_length(&self) -> usize {
        if !matches!(self.peek(0), Some(b'e' | b'E')) {
            return 0;
        }
        let sign_length = usize::from(matches!(self.peek(1), Some(b'+' | b'-')));
        let mut length = 1 + sign_length;
        while self.peek(length).is_some_and(|next| next.is_ascii_digit()) {
            length += 1;
        }
        if length == 1 + sign_length {
            0
        } else {
            length
        }
    }
}
